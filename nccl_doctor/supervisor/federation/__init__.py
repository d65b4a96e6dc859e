"""Several hosts, one diagnosis: the supervisors of a multi-node job meet (docs/nodes.md).

One `nccl-doctor run` per node wraps that node's launcher. They find each other from the
launcher's own rendezvous arguments (rendezvous.py) and meet on a torch TCPStore that node 0's
supervisor hosts on its own port (store.py). Followers publish their ranks' progress and, when
quiet, their ranks in brief; the leader's watches run on the union - the same watches and passes
as on one host, through ``FederatedJob`` - and every decision (report, stop) goes to every node
(link.py). A node that cannot meet the others diagnoses its own ranks and says so.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nccl_doctor.supervisor.federation.job import FederatedJob
    from nccl_doctor.supervisor.federation.node import Federation
    from nccl_doctor.supervisor.federation.rendezvous import Rendezvous

__all__ = ["Federation", "FederatedJob", "Rendezvous"]

#: Imported when first asked for: the CLI's parser reads ``rendezvous`` and ``store`` of this
#: package, and must not import the supervisor's live job (numpy, the capture readers) for it.
_LAZY = {"FederatedJob": "job", "Federation": "node", "Rendezvous": "rendezvous"}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
