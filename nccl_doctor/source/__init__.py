"""The source analysis both callers share: the run's analysis (analysis/why/, reading the
frames a hung rank recorded) and ``nccl-doctor check`` (check/, reading files before the run).
One engine, two callers, the same answers.

- ``source_text``: a file's lines, read once and bounded (its fingerprint, its regions).
- ``rank_terms``: which expressions can differ from rank to rank.
- ``rank_flow``: a rank-derived value followed through arguments, returns and attributes.
- ``polarity``: which ranks a condition's arm holds.
- ``branch``: the branch on the rank (and the data jumps and loops) around a frame's line.
- ``sites``: where a module makes collectives (and calls functions of its own that do).
- ``catalog`` / ``catalog_calls``: the library calls that make collectives (the JSON catalog,
  read as data; matched at a call site by the installed versions).
- ``sharding``: where a program shards its model, and its ``generate`` calls unsynced.

Imports nothing of ``nccl_doctor.analysis`` or ``nccl_doctor.check`` (tests/unit/test_layout.py)."""
