"""Silent errors: the run goes on but is worthless (BUGS.md, bug C).

In the rank (``hooks``, ``fingerprint``): hashes - never raw states or texts - of the RNG states
after seeding calls and at steps, of every generation, and the logged training metrics, written as
notes into the rank's capture. Outside it (nccl_doctor.analysis.silent): the cross-rank comparison,
which adds no collective to the job.
"""
