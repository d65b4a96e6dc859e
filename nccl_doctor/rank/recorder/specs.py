"""Which torch.distributed functions the recorder wraps, and where their arguments are.

One ``Spec`` per function: its event kind, and the parameters that hold the group, the input and
output tensors and the root/peer. Positions are resolved from the real signature at patch time, so
a call can be described without ``inspect`` on the hot path.
"""

from __future__ import annotations

from dataclasses import dataclass

from nccl_doctor.capture.format import EventFlag, EventKind

C, P = EventKind.COLLECTIVE, EventKind.P2P


@dataclass(frozen=True)
class Spec:
    name: str
    kind: EventKind
    inp: str | None = None  # parameter holding the input tensor(s)
    out: str | None = None  # parameter holding the output tensor(s), when distinct from inp
    roots: tuple[str, ...] = ()  # src/dst (global ranks) then group_src/group_dst (group ranks)
    group: str | None = "group"
    flags: EventFlag = EventFlag.NONE
    always_async: bool = False  # isend / irecv / batch_isend_irecv return Work(s)


_G = ("src", "group_src")
_D = ("dst", "group_dst")
COMPOSITE = EventFlag.COMPOSITE

SPECS: tuple[Spec, ...] = (
    Spec("all_reduce", C, inp="tensor"),
    Spec("all_reduce_coalesced", C, inp="tensors", flags=EventFlag.COALESCED),
    Spec("all_gather", C, inp="tensor", out="tensor_list"),
    Spec("all_gather_into_tensor", C, inp="input_tensor", out="output_tensor"),
    Spec("all_gather_single", C, inp="input_tensor", out="output_tensor"),
    Spec("_all_gather_base", C, inp="input_tensor", out="output_tensor", flags=COMPOSITE),
    Spec("all_gather_coalesced", C, inp="input_tensor_list", out="output_tensor_lists",
         flags=EventFlag.COALESCED),
    Spec("all_gather_object", C, inp="obj", flags=COMPOSITE),
    Spec("reduce", C, inp="tensor", roots=_D),
    Spec("broadcast", C, inp="tensor", roots=_G),
    Spec("broadcast_object_list", C, inp="object_list", roots=_G, flags=COMPOSITE),
    Spec("gather", C, inp="tensor", out="gather_list", roots=_D),
    Spec("gather_object", C, inp="obj", roots=_D, flags=COMPOSITE),
    Spec("scatter", C, inp="scatter_list", out="tensor", roots=_G),
    Spec("scatter_object_list", C, inp="scatter_object_input_list", roots=_G, flags=COMPOSITE),
    Spec("reduce_scatter", C, inp="input_list", out="output"),
    Spec("reduce_scatter_tensor", C, inp="input", out="output"),
    Spec("reduce_scatter_single", C, inp="input", out="output"),
    Spec("_reduce_scatter_base", C, inp="input", out="output", flags=COMPOSITE),
    Spec("all_to_all", C, inp="input_tensor_list", out="output_tensor_list"),
    Spec("all_to_all_single", C, inp="input", out="output"),
    Spec("barrier", C),
    Spec("monitored_barrier", C),
    Spec("send", P, inp="tensor", roots=_D),
    Spec("recv", P, inp="tensor", roots=_G),
    Spec("isend", P, inp="tensor", roots=_D, always_async=True),
    Spec("irecv", P, inp="tensor", roots=_G, always_async=True),
    Spec("send_object_list", P, inp="object_list", roots=_D, flags=COMPOSITE),
    Spec("recv_object_list", P, inp="object_list", roots=_G, flags=COMPOSITE),
    Spec("batch_isend_irecv", P, inp="p2p_op_list", group=None, flags=COMPOSITE,
         always_async=True),
    Spec("new_group", EventKind.GROUP, inp=None, group=None),
    Spec("new_subgroups", EventKind.GROUP, group="group"),
    Spec("new_subgroups_by_enumeration", EventKind.GROUP, group=None),
    Spec("split_group", EventKind.GROUP, group="parent_pg"),
    Spec("destroy_process_group", EventKind.DESTROY),
)
