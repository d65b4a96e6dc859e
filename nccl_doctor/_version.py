"""The version of nccl-doctor (one place: pyproject and the capture header read it)."""

__version__ = "0.1.0"
