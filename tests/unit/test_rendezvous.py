"""Where the nodes of a multi-node job meet, read from the launch command (federation/rendezvous.py)."""

import pytest

from nccl_doctor.supervisor.federation.rendezvous import (
    PORT_OFFSET, RendezvousError, doctor_port, find, launcher_options, several_nodes,
)

TORCHRUN = ["torchrun", "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "8",
            "--master-addr", "10.0.0.5", "--master-port", "29500", "train.py", "--lr", "1e-4"]


def test_torchrun_master_address_and_port():
    r = find(TORCHRUN, {})
    assert (r.host, r.port, r.nnodes, r.node_rank) == ("10.0.0.5", 29500 + PORT_OFFSET, 2, 1)
    assert r.job == "10.0.0.5:29500" and "torchrun" in r.source


def test_equals_forms_underscores_and_python_m():
    cmd = ["python", "-m", "torch.distributed.run", "--nnodes=4", "--node_rank=0",
           "--master_addr=host0", "--master_port=1234", "--standalone", "train.py"]
    r = find(cmd, {})
    assert (r.host, r.port, r.nnodes, r.node_rank) == ("host0", 1234 + PORT_OFFSET, 4, 0)


def test_rdzv_endpoint_and_an_elastic_node_count():
    cmd = ["torchrun", "--nnodes", "1:4", "--rdzv-backend", "c10d", "--rdzv-endpoint",
           "head:29400", "-m", "trainer", "--nnodes", "99"]
    r = find(cmd, {})
    assert (r.host, r.port, r.nnodes, r.node_rank) == ("head", 29400 + PORT_OFFSET, 4, None)


def test_the_scripts_own_arguments_are_not_the_launchers():
    cmd = ["torchrun", "--nproc-per-node", "2", "train.py", "--nnodes", "2",
           "--master-addr", "x", "--master-port", "1"]
    assert launcher_options(cmd, 1) == {"--nproc-per-node": "2"}
    assert find(cmd, {}) is None  # one node: nothing to meet


def test_torchruns_environment_twins_and_master_addr():
    r = find(["torchrun", "train.py"], {"PET_NNODES": "2", "PET_NODE_RANK": "1",
                                        "PET_MASTER_ADDR": "h", "PET_MASTER_PORT": "40000"})
    assert (r.host, r.port, r.node_rank) == ("h", 40000 + PORT_OFFSET, 1)
    r = find(["torchrun", "--nnodes", "2", "train.py"], {"MASTER_ADDR": "m", "MASTER_PORT": "5"})
    assert (r.host, r.port, r.source) == ("m", 5 + PORT_OFFSET, "MASTER_ADDR/MASTER_PORT")


def test_accelerate_and_deepspeed():
    acc = ["accelerate", "launch", "--multi_gpu", "--num_machines", "2", "--machine_rank", "1",
           "--main_process_ip", "a0", "--main_process_port", "8000", "train.py"]
    r = find(acc, {})
    assert (r.host, r.port, r.nnodes, r.node_rank) == ("a0", 8000 + PORT_OFFSET, 2, 1)
    ds = ["deepspeed", "--num_nodes", "3", "--node_rank", "2", "--no_ssh", "--master_addr", "d0",
          "--master_port", "7000", "train.py"]
    r = find(ds, {})
    assert (r.host, r.port, r.nnodes, r.node_rank) == ("d0", 7000 + PORT_OFFSET, 3, 2)


def test_the_options_override_and_coordinator_works_for_any_command():
    r = find(["python", "train.py"], {}, coordinator="boss:9000", node_rank=3, nnodes=4)
    assert (r.host, r.port, r.nnodes, r.node_rank, r.source) == ("boss", 9000, 4, 3,
                                                                 "--coordinator")
    r = find(TORCHRUN, {}, node_rank=0)
    assert r.node_rank == 0
    assert find(["python", "train.py"], {}) is None


def test_several_nodes_but_nowhere_to_meet():
    cmd = ["torchrun", "--nnodes", "2", "train.py"]
    assert find(cmd, {}) is None and several_nodes(cmd, {})
    assert not several_nodes(["torchrun", "--nnodes", "1", "train.py"], {})


@pytest.mark.parametrize("bad", ["nohost", "h:notaport", "h:0", ":80"])
def test_a_bad_coordinator_is_refused(bad):
    with pytest.raises(RendezvousError):
        find(["python", "t.py"], {}, coordinator=bad)


def test_the_doctors_port_stays_a_port():
    assert doctor_port(29500) == 29500 + PORT_OFFSET
    assert doctor_port(65000) == 65000 - PORT_OFFSET
