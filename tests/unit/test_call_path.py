"""Library or user code by where a file is installed, the frames that only pass a call on, and
which frame of a call path issued the call (issue 39)."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

from nccl_doctor import call_path, paths
from nccl_doctor.location import Location
from nccl_doctor.rank.recorder.passes_on import passes_on

SITE = "/v/lib/python3.11/site-packages/"


@pytest.fixture
def patterns():
    """paths.configure for one test, put back after it."""
    before = paths.patterns()
    yield paths.configure
    paths.configure(*before)


@pytest.mark.parametrize("path, library", [
    (SITE + "lightning/pytorch/strategies/ddp.py", True),  # any installed package, no list
    (SITE + "mycompany_tools/x.py", True),
    ("/usr/lib/python3/dist-packages/numpy/core.py", True),  # Debian
    ("/usr/lib/python3.11/functools.py", True),  # the standard library
    ("/opt/conda/lib/python3.12/threading.py", True),
    ("/srv/app.pyz/app/main.py", True),  # a zip import
    ("<frozen runpy>", True),
    ("/home/me/proj/train.py", False),  # the user's script
    ("/home/me/proj/src/mypkg/model.py", False),  # the user's package, installed editable
    ("/work/site-packages-notes/train.py", False),  # a name that only looks like one
])
def test_library_code_is_installed_code(path, library):
    assert paths.is_library_file(path) is library
    assert paths.is_user_file(path) is not library


@pytest.mark.parametrize("path, generated", [
    ("<eval_with_key>.12", True),  # an FX graph module's code
    ("/tmp/torchinductor_me/bt/cbtctpvo3w6z2epmgmklxkpqpqzixjmqteuuthofe5n5w4yz7uvk.py", True),
    ("/scratch/cache/bt/cbtctpvo3w6z2epmgmklxkpqpqzixjmqteuuthofe5n5w4yz7uvk.py", True),
    ("/home/me/proj/bt/cache.py", False),
    ("/home/me/proj/train.py", False),
])
def test_code_torch_compile_generates_is_torchs(path, generated):
    """Inductor's output modules (in its cache, wherever TORCHINDUCTOR_CACHE_DIR puts it) and
    FX graphs are torch's: a compiled call names the user's line that called the compiled
    function, never generated code."""
    assert paths.is_internal_file(path) is generated
    assert paths.is_library_file(path) is generated


def test_console_scripts_of_the_interpreter_are_library_code(patterns):
    assert paths.is_library_file(os.path.join(sys.prefix, "bin", "torchrun"))
    patterns(prefixes=["/opt/rank-env"])  # a rank's own interpreter, recorded in its capture
    assert paths.is_library_file("/opt/rank-env/bin/accelerate")
    assert not paths.is_library_file("/opt/rank-env-scripts/train.py")


def test_patterns_override_where_the_file_is(patterns, tmp_path):
    patterns(user_code=["*/site-packages/mycompany_*/*"], library_code=[str(tmp_path / "vendor")])
    assert paths.is_user_file(SITE + "mycompany_tools/x.py")
    assert paths.is_library_file(SITE + "lightning/pytorch/trainer/trainer.py")
    assert paths.is_library_file(str(tmp_path / "vendor" / "fw" / "loop.py"))  # a directory
    assert paths.is_user_file(str(tmp_path / "train.py"))
    # torch and nccl-doctor are library code whatever a pattern says
    patterns(user_code=["*"])
    assert paths.is_library_file(SITE + "torch/distributed/distributed_c10d.py")
    assert paths.is_user_file(SITE + "lightning/pytorch/trainer/trainer.py")
    # both: library code
    patterns(user_code=["*/proj/*"], library_code=["*/proj/vendor/*"])
    assert paths.is_library_file("/home/me/proj/vendor/x.py")
    assert paths.is_user_file("/home/me/proj/train.py")


def test_patterns_travel_in_the_environment(patterns):
    env = paths.with_patterns({paths.USER_CODE_ENV: "*/a/*"}, ["*/b/*"], ["*/c/*"])
    assert env[paths.USER_CODE_ENV] == os.pathsep.join(["*/a/*", "*/b/*"])
    paths.configure_from(env)
    assert paths.patterns() == (("*/a/*", "*/b/*"), ("*/c/*",))


# -- frames that only pass their call on: real code objects, asked where they call --------------

LIBRARY = '''
import functools

seen = []


def callee(*args, **kwargs):
    import sys
    frame = sys._getframe(1)
    seen.append([(f.f_code, f.f_lasti) for f in (frame, frame.f_back)])


def deprecated(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        import warnings
        warnings.warn("old", DeprecationWarning, stacklevel=2)
        return fn(*args, **kwargs)
    return wrapper


@deprecated
def forwarding(output_tensor, input_tensor, group=None, async_op=False):
    return callee(output_tensor=output_tensor, input_tensor=input_tensor, group=group,
                  async_op=async_op)


def constants_only(name):
    callee("Trainer.save_checkpoint")


def no_arguments():
    callee()


def builds_a_buffer(tensor):
    out = [tensor, tensor]
    callee(out, tensor)


def reassigns(tensor):
    tensor = tensor + 1
    callee(tensor)


def stages(*args, **kwargs):
    args = [a for a in args]
    kwargs = {k: v for k, v in kwargs.items()}
    return callee(*args, **kwargs)


def multiline(x,
              group=None):
    return callee(
        x,
        group=group,
    )


def computed_keyword(x):
    callee(x, group=[1, 2])
'''


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    path = tmp_path_factory.mktemp("lib") / "fakelib.py"
    path.write_text(LIBRARY)
    spec = importlib.util.spec_from_file_location("fakelib", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("call, args, passes", [
    ("forwarding", (1, 2), True),  # a comm shim: its own parameters by keyword
    ("constants_only", ("x",), True),  # Lightning's save_checkpoint -> strategy.barrier("...")
    ("no_arguments", (), True),  # a strategy's barrier() -> torch.distributed.barrier()
    ("stages", (1, 2), True),  # *args/**kwargs rebuilt and passed on (DeepSpeed's stage_on_cpu)
    ("multiline", (1,), True),
    ("builds_a_buffer", (1,), False),  # it made an argument: it may be the issuing line
    ("reassigns", (1,), False),
    ("computed_keyword", (1,), False),
])
def test_a_frame_passes_its_call_on_when_it_adds_nothing_of_its_own(lib, call, args, passes):
    lib.seen.clear()
    getattr(lib, call)(*args)
    code, lasti = lib.seen[-1][0]
    assert passes_on(code, lasti) is passes


def test_a_decorators_wrapper_passes_its_call_on(lib):
    """``wrapper(*args, **kwargs)`` of a decorator (typing_extensions.deprecated's,
    functools.wraps's): after its own work (a warning), it passes its call on unchanged."""
    import warnings

    lib.seen.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lib.forwarding(1, 2)
    (inner, lasti), (outer, outer_lasti) = lib.seen[-1]
    assert inner.co_name == "forwarding" and outer.co_name == "wrapper"
    assert passes_on(outer, outer_lasti) is True


def test_unreadable_source_says_no(tmp_path):
    code = compile("def f(x):\n    return g(x)\n", str(tmp_path / "gone.py"), "exec")
    assert passes_on(code.co_consts[0], 0) is False


# -- which frame issued the call ----------------------------------------------------------------

def loc(path: str, line: int, function: str = "", passes: bool = False,
        by_torch: bool = False) -> Location:
    return Location(path, line, function, passes_on=passes, from_torch=by_torch)


USER = loc("/job/train.py", 36, "main")


def test_another_library_asking_for_the_call_issued_it():
    """transformers' evaluation_loop -> Accelerate's gather helpers -> torch: the line of
    transformers that asked (TRL's get_batch_loss_metrics likewise), not Accelerate's helper."""
    path = (loc(SITE + "accelerate/utils/operations.py", 355, "_gpu_gather_one"),
            loc(SITE + "accelerate/utils/operations.py", 127, "recursively_apply", True),
            loc(SITE + "accelerate/accelerator.py", 3151, "Accelerator.gather_for_metrics", True),
            loc(SITE + "transformers/trainer.py", 3007, "Trainer.evaluation_loop"),
            USER)
    assert call_path.issuing(path, USER) == path[3]


def test_the_innermost_deciding_frame_of_a_framework_the_user_called():
    """the user's trainer.fit() -> Lightning's loop, which broadcasts itself."""
    path = (loc(SITE + "lightning/pytorch/loops/training_epoch_loop.py", 265, "bcast"),
            loc(SITE + "lightning/pytorch/loops/training_epoch_loop.py", 300, "advance", True),
            loc(SITE + "lightning/pytorch/trainer/trainer.py", 584, "Trainer.fit"),
            USER)
    assert call_path.issuing(path, USER) == path[0]


def test_a_hook_torch_called_decides_itself():
    """DeepSpeed's ZeRO-3 hooks, called by torch from transformers' forward: DeepSpeed's line
    that gathers, past its comm shims and a typing_extensions deprecation wrapper."""
    path = (loc(SITE + "typing_extensions.py", 3140, "deprecated.wrapper", True),
            loc(SITE + "deepspeed/comm/torch.py", 380, "all_gather_into_tensor", True),
            loc(SITE + "deepspeed/runtime/zero/partition_parameters.py", 1395, "_all_gather"),
            loc(SITE + "deepspeed/runtime/zero/parameter_offload.py", 400, "_pre_forward_hook",
                by_torch=True),
            loc(SITE + "transformers/models/llama/modeling_llama.py", 300, "forward"),
            USER)
    assert call_path.issuing(path, USER) == path[2]


def test_pass_on_frames_all_the_way_leave_the_users_line():
    """the user's callback -> Lightning's save_checkpoint -> strategy.barrier() -> torch."""
    cb = loc("/job/train.py", 27, "Save.on_train_batch_end")
    path = (loc(SITE + "lightning/pytorch/strategies/ddp.py", 303, "DDPStrategy.barrier", True),
            loc(SITE + "lightning/pytorch/trainer/trainer.py", 1465, "Trainer.save_checkpoint",
                True),
            cb)
    assert call_path.issuing(path, cb) == cb


def test_the_users_own_call_and_an_empty_path():
    assert call_path.issuing((USER,), USER) == USER
    assert call_path.issuing((), USER) == USER
    assert call_path.issuing((), None) is None
