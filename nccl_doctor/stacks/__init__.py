"""Python stacks of a job's ranks, as data (pure): ``rank_stack`` (the model and the one parser of
py-spy's and the in-rank agent's JSON), ``aggregate`` (STAT-like classes: "3 ranks here, 1 rank
there"), ``summary`` (where a rank is in the user's code), ``samples`` (stragglers.jsonl). Taking
them is the supervisor's (nccl_doctor/supervisor/pyspy.py, evidence.py)."""
