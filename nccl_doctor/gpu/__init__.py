"""GPUs seen from outside the job, through NVML: which rank runs on which device, and samples of
what each device does (utilisation, SM clock, power against its limit, memory, interconnect).

- ``model``: the typed samples (pure);
- ``nvml``: the NVML boundary (nvidia-ml-py, import name ``pynvml``);
- ``mapping``: rank -> device, from NVML's per-process list or the rank's environment (pure);
- ``series``: the ``gpu.jsonl`` file in the capture directory (bounded);
- ``sampler``: the supervisor's sampling thread (slow while healthy, fast on a suspected hang);
- ``signature``: what a series of samples says a device is doing: idle, computing, spinning.
"""
