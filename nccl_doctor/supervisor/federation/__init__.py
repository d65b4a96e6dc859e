"""Several hosts, one diagnosis: the supervisors of a multi-node job meet (DESIGN.md, "Several
hosts").

One `nccl-doctor run` per node wraps that node's launcher. They find each other from the
launcher's own rendezvous arguments (rendezvous.py) and meet on a torch TCPStore that node 0's
supervisor hosts on its own port (store.py). Followers publish their ranks' progress and, when
quiet, their ranks in brief; the leader's watches run on the union - the same watches and passes
as on one host, through ``FederatedJob`` - and every decision (report, stop) goes to every node
(link.py). A node that cannot meet the others diagnoses its own ranks and says so.
"""

from nccl_doctor.supervisor.federation.job import FederatedJob
from nccl_doctor.supervisor.federation.node import Federation
from nccl_doctor.supervisor.federation.rendezvous import Rendezvous

__all__ = ["Federation", "FederatedJob", "Rendezvous"]
