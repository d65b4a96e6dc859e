"""Which frame of a call path issued the call: the line that decided to make it.

A call path is the frames outside torch, innermost first (rank/recorder/arguments.py). Frames
that only pass the call on (``Location.passes_on``: decorators' wrappers, comm shims) never
issue it. Of the rest, the frame asked for the call where one package asks another for it:

- the user's own code calling torch issued it;
- a library's frames nearest torch (Accelerate's gather helpers, a Lightning strategy) that
  another library called directly (TRL's ``get_batch_loss_metrics``, transformers'
  ``evaluation_loop``) did what that caller asked: the caller's line issued it;
- frames nearest torch that the user's code called (``trainer.fit()``, ``accelerator.reduce()``)
  or that torch called back (a DeepSpeed ZeRO-3 module hook, ``Location.from_torch``) decided
  themselves: the innermost of them that does more than pass the call on issued it.

Pure: locations in, a location out.
"""

from __future__ import annotations

from typing import Sequence

from nccl_doctor import paths
from nccl_doctor.location import Location

__all__ = ["issuing", "library_label"]


def library_label(path: str) -> str:
    """The installed package a library file belongs to (``accelerate``), ``python`` for the
    standard library, else the path itself (a console script, a zip import)."""
    package = paths.package_of(path)
    if package is not None:
        return package
    return "python" if paths.is_stdlib_file(path) else path


def issuing(path: Sequence[Location], site: Location | None) -> Location | None:
    """The frame of ``path`` that issued the call (module docstring); ``site`` (the user's
    line) when the path is empty or every library frame in it only passes the call on."""
    first = next((i for i, loc in enumerate(path)
                  if not loc.passes_on or paths.is_user_file(loc.path)), None)
    if first is None:
        return site or (path[0] if path else None)
    here = path[first]
    if paths.is_user_file(here.path):
        return here
    package = library_label(here.path)
    last = first  # the run of this package's frames (pass-on frames of any package join it)
    while (last + 1 < len(path) and not path[last].from_torch
           and paths.is_library_file(path[last + 1].path)
           and (path[last + 1].passes_on or library_label(path[last + 1].path) == package)):
        last += 1
    caller = last + 1
    if caller < len(path) and not path[last].from_torch and \
            paths.is_library_file(path[caller].path):
        # another library asked this one for the call
        return next((loc for loc in path[caller:]
                     if not loc.passes_on or paths.is_user_file(loc.path)), site or here)
    return here
