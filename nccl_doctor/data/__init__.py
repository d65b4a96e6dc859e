"""Recorded jobs as data: ``nccl_doctor.open(...)`` (job.py) and the calls table's columns
(columns.py), which ``nccl-doctor export`` writes to Parquet or CSV (export.py)."""
