"""The Jinja2 environment of nccl-doctor's pages (report.html, the live page): autoescape on,
undefined names an error, and the compiled templates kept between processes.

Compiling report.html's template costs 50-90 ms of CPU, paid by every run at its end (and on the
2-core machine of docs/benchmarks/run_edges.md, by the job's own start, where the page is
prepared). Jinja2's bytecode cache keeps the compiled code in a directory of the user's own
(Jinja2's default: ``_jinja2-cache-UID`` in the system's temporary directory, created mode 0700
and refused if another user owns it), keyed by the template's name and checked against its
source and the Python and Jinja2 versions, so a changed template or interpreter compiles anew.
Where that directory cannot be made, the templates are compiled in each process, as before.
"""

from __future__ import annotations

from pathlib import Path

import jinja2


def environment(folder: Path) -> jinja2.Environment:
    """The environment of the templates in ``folder``."""
    try:
        cache: jinja2.BytecodeCache | None = jinja2.FileSystemBytecodeCache()
    except (OSError, RuntimeError):  # no temporary directory of our own: compiled each time
        cache = None
    return jinja2.Environment(loader=jinja2.FileSystemLoader(folder), autoescape=True,
                              undefined=jinja2.StrictUndefined, trim_blocks=True,
                              lstrip_blocks=True, bytecode_cache=cache)
