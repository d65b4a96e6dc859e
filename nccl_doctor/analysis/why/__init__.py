"""Why a rank did what it did, read from the source: the branch that decided a call, the rank
terms and how a rank-derived value flows through arguments, returns and attributes, the loops
whose counts differ, a data-driven jump (a NaN guard's ``continue``).

Imports only ``calls``."""
