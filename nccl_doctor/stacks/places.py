"""Where a rank's thread is, read from its stack (pure): inside one of torch.distributed's own
waits, waiting on its DataLoader's workers, or in code of its own.

A rank with no call pending in its capture may still be blocked in torch.distributed: in the
rendezvous of ``init_process_group`` (before its capture exists), in a store-based barrier,
inside ``new_group`` or a DeviceMesh being made (their record says so too), or in an object
collective's store keys. Such a wait can only end when a peer arrives; when every other rank is
blocked too, nothing will arrive and the hang is as certain as a collective deadlock
(docs/watchdog.md). A rank in its own code (data loading, a lock, ``input()``) may be slow, not
stuck: the watchdog samples it over time before it says so.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from nccl_doctor.location import Location
from nccl_doctor.stacks.rank_stack import IN_DISTRIBUTED, RankStack, ThreadStack
from nccl_doctor.stacks.summary import own_frame


class PlaceKind(str, enum.Enum):
    RENDEZVOUS = "rendezvous"  # init_process_group: the store, the rendezvous, its barrier
    GROUP_CREATION = "group_creation"  # new_group, new_subgroups, split_group, DeviceMesh
    STORE = "store"  # a store-based wait of torch's (barrier, object collective keys)
    COLLECTIVE = "collective"  # inside a collective or point-to-point call
    DATALOADER = "dataloader"  # waiting on the DataLoader's worker processes
    OUTSIDE = "outside"  # in the rank's own code, outside torch.distributed

    @property
    def blocked_in_torch(self) -> bool:
        """A wait of torch.distributed's that only a peer can end."""
        return self in (PlaceKind.RENDEZVOUS, PlaceKind.GROUP_CREATION, PlaceKind.STORE)


#: torch.distributed functions, by what waiting inside them means (matched outermost first: a
#: store barrier inside init_process_group is the rendezvous's).
_BY_FUNCTION: tuple[tuple[PlaceKind, frozenset[str]], ...] = (
    (PlaceKind.RENDEZVOUS, frozenset({
        "init_process_group", "rendezvous", "_create_c10d_store", "_env_rendezvous_handler",
        "_tcp_rendezvous_handler", "_file_rendezvous_handler", "_rendezvous_helper",
        "next_rendezvous", "_create_tcp_store"})),
    (PlaceKind.GROUP_CREATION, frozenset({
        "new_group", "_new_group_with_tag", "new_subgroups", "new_subgroups_by_enumeration",
        "split_group", "init_device_mesh", "_init_process_groups", "_get_or_create_default_group",
        "_new_process_group_helper"})),
    (PlaceKind.STORE, frozenset({
        "_store_based_barrier", "monitored_barrier", "_store_get", "_wait_for_keys"})),
)
#: torch's store helpers (torchrun's agents, checkpointing): every function there waits on keys
_STORE_HELPERS = re.compile(r"torch[/\\]distributed[/\\]elastic[/\\]utils[/\\]store\.py$")
_DATALOADER = re.compile(r"torch[/\\]utils[/\\]data[/\\]dataloader\.py$")
_DATALOADER_WAITS = frozenset({"_next_data", "_get_data", "_try_get_data", "__next__"})


@dataclass(frozen=True)
class Place:
    """Where one rank's thread is: the kind of place, the torch function it waits in (when in
    torch.distributed) and the user's innermost frame."""

    kind: PlaceKind
    function: str = ""  # the torch.distributed function, outermost of its kind
    frame: Location | None = None  # the innermost frame in the rank's own code

    def describe(self) -> str:
        """A few words: "in the rendezvous (init_process_group)"."""
        where = f" at {self.frame.text('in')}" if self.frame is not None else ""
        what = {
            PlaceKind.RENDEZVOUS: "in the rendezvous",
            PlaceKind.GROUP_CREATION: "making a process group",
            PlaceKind.STORE: "in a store-based wait of torch.distributed",
            PlaceKind.COLLECTIVE: "inside a collective",
            PlaceKind.DATALOADER: "waiting on its DataLoader's workers",
            PlaceKind.OUTSIDE: "in its own code, outside torch.distributed",
        }[self.kind]
        called = f" ({self.function})" if self.function else ""
        return f"{what}{called}{where}"


def place(stack: RankStack) -> Place | None:
    """Where ``stack``'s collectives thread is (None: no stack was taken)."""
    thread = stack.thread
    if thread is None or not thread.frames:
        return None
    return thread_place(thread)


def thread_place(thread: ThreadStack) -> Place:
    frames = thread.root_first
    mine = own_frame(thread)
    for kind, names in _BY_FUNCTION:
        for f in frames:  # outermost first
            if _bare(f.function) in names and IN_DISTRIBUTED.search(f.path):
                return Place(kind, f.function, mine)
    for f in frames:
        if _STORE_HELPERS.search(f.path):
            return Place(PlaceKind.STORE, f.function, mine)
    if any(_DATALOADER.search(f.path) and _bare(f.function) in _DATALOADER_WAITS
           for f in frames):
        return Place(PlaceKind.DATALOADER, "", mine)
    if any(IN_DISTRIBUTED.search(f.path) for f in thread.frames[:3]):
        return Place(PlaceKind.COLLECTIVE, thread.frames[0].function, mine)
    return Place(PlaceKind.OUTSIDE, "", mine)


def _bare(function: str) -> str:
    """``_get_data`` of py-spy's ``_MultiProcessingDataLoaderIter._get_data``."""
    return function.rpartition(".")[2]
