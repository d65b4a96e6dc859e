"""Slow, not wrong: a rank or node that arrives last, compared with ranks of its own role; a
pipeline stage slower than the others; a rank busy outside collectives.

Imports ``calls`` and ``who``."""
