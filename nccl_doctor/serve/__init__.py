"""``nccl-doctor run --serve``: the job live over HTTP - Prometheus metrics, the report, a page
(state.py what is served, publisher.py how the supervisor publishes it, server.py the endpoint,
metrics.py and page.py the two drawings)."""
