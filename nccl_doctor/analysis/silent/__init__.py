"""Silent: the job runs and is wrong. Every rank sampling the same completions (a seed bug),
rewards with no variance, calls paired across different steps.

Imports ``calls``, ``why`` and ``who``."""
