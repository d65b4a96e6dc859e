"""Python stacks of a job's ranks: taken with py-spy (or by the in-rank agent), grouped like STAT.

``collect`` samples every rank in parallel, ``classify`` groups ranks whose main threads stand in
the same place, and ``format_classes`` renders the groups as "3 ranks here, 1 rank there".
"""

from nccl_doctor.stacks.aggregate import (
    StackClass, classify, common_prefix, divergence, format_classes, rank_list,
)
from nccl_doctor.stacks.rank_stack import SOURCES, Location, RankStack, ThreadStack, parse_stack_json
from nccl_doctor.supervisor.pyspy import PYSPY_ENV, collect, dump, find_pyspy, unavailable_reason

__all__ = [
    "Location", "ThreadStack", "RankStack", "SOURCES", "parse_stack_json",
    "StackClass", "classify", "common_prefix", "divergence", "format_classes", "rank_list",
    "PYSPY_ENV", "find_pyspy", "dump", "collect", "unavailable_reason",
]
