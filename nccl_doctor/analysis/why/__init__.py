"""Why a rank did what it did, where the recorded calls meet the source (nccl_doctor/source/,
the source analysis shared with ``nccl-doctor check``): the loops whose counts differ, a
data-driven jump (a NaN guard's ``continue``), and the rule ``check`` finds a root cause by.

Imports only ``calls`` (and nccl_doctor.source, nccl_doctor.check)."""
