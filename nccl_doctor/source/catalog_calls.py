"""The library calls that make collectives on every rank (the catalog the run names them by:
plugins/collective_calls.json, read by source/catalog.py), as a call site of the user's
shows them.

The run matches a library's frame by its qualname; a call site has only the receiver's name.
So an entry is matched by its method's name where that name says it (``wait_for_everyone``,
``gather_for_metrics``, ``pad_across_processes``), by the name and a receiver named for the
class (``trainer.evaluate()``, ``trainer.save_checkpoint()``, ``engine.save_checkpoint()``,
``accelerator.gather()``), or by the module the name was imported from (DCP's ``dcp.save``).
Each entry applies only where its package is installed in a version within its range."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import metadata

from nccl_doctor.source.catalog import builtin_catalog, in_range, version_key

#: method -> the ways a call of it is told to be an entry's: (the words a receiver's name must
#: hold, one of them; None: any receiver; "self@LightningModule": ``self`` in a class deriving
#: from it), the keyword it must pass as True (or None), the entry ids (the first installed)
_METHODS: dict[str, tuple[tuple[tuple[str, ...] | None, str | None, tuple[str, ...]], ...]] = {
    "wait_for_everyone": ((None, None, ("accelerate-wait-for-everyone",)),),
    "gather_for_metrics": ((None, None, ("accelerate-gather-for-metrics",)),),
    "pad_across_processes": ((None, None, ("accelerate-pad-across-processes",)),),
    "gather": ((("accelerator",), None, ("accelerate-gather",)),),
    "reduce": ((("accelerator",), None, ("accelerate-reduce",)),
               (("strategy",), None, ("lightning-strategy-reduce",))),
    "reduce_boolean_decision": ((("strategy",), None, ("lightning-strategy-reduce",)),),
    "barrier": ((("strategy",), None, ("lightning-strategy-barrier",)),),
    "broadcast": ((("strategy",), None, ("lightning-strategy-broadcast",)),),
    "all_gather": ((("strategy",), None, ("lightning-strategy-all-gather",)),
                   (("self@LightningModule",), None, ("lightning-module-all-gather",))),
    # (self.log(..., sync_dist=True) reduces the value across the ranks: Lightning's)
    "log": ((None, "sync_dist", ("lightning-module-log-sync-dist",)),),
    "log_dict": ((None, "sync_dist", ("lightning-module-log-sync-dist",)),),
    "evaluate": ((("trainer",), None, ("transformers-trainer-evaluate",)),),
    "predict": ((("trainer",), None, ("transformers-trainer-predict",)),),
    "save_checkpoint": ((("trainer", "engine"), None, ("lightning-trainer-save-checkpoint",
                                                         "deepspeed-save-checkpoint")),),
    "load_checkpoint": ((("engine",), None, ("deepspeed-load-checkpoint",)),),
}
#: module -> function -> entry id (names resolved through the module's imports)
_FUNCTIONS = {
    "torch.distributed.checkpoint": {"save": "torch-dcp-save", "save_state_dict": "torch-dcp-save",
                                     "async_save": "torch-dcp-async-save",
                                     "load": "torch-dcp-load",
                                     "load_state_dict": "torch-dcp-load"},
}


@dataclass(frozen=True)
class Installed:
    """A catalog entry whose package is installed within its range: the package it is."""

    id: str
    package: str
    what: str
    fix: str


Versions = tuple[tuple[str, str], ...]  # (package, version) pairs, sorted: a cache key


@functools.lru_cache(maxsize=8)
def entries(versions: Versions = ()) -> dict[str, Installed]:
    """The catalog's entries whose package is installed within their version range.
    ``versions``: the packages' versions to read instead (a run's ranks recorded them, in their
    own environment); a package not among them is read from this interpreter's."""
    given = dict(versions)
    out = {}
    for e in builtin_catalog().entries:
        for package in e.packages:
            version = given.get(package) or _installed(package)
            if version is not None and version_key(version) is not None \
                    and in_range(version, e.versions):
                out[e.id] = Installed(e.id, package, e.what, e.fix)
                break
    return out


def _installed(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def method_entry(method: str, receiver: str | None, true_keywords: frozenset[str] = frozenset(),
                 bases: tuple[str, ...] = (), versions: Versions = ()) -> Installed | None:
    """The catalog entry a call ``receiver.method(...)`` makes, if any (installed).
    ``true_keywords``: the keywords it passes as True; ``bases``: the base classes of the class
    whose method makes the call (for ``self``)."""
    known = entries(versions)
    for words, keyword, ids in _METHODS.get(method, ()):
        if keyword is not None and keyword not in true_keywords:
            continue
        if words is not None and not any(_receiver_is(w, receiver, bases) for w in words):
            continue
        found = next((known[i] for i in ids if i in known), None)
        if found is not None:
            return found
    return None


def _receiver_is(word: str, receiver: str | None, bases: tuple[str, ...]) -> bool:
    if word.startswith("self@"):
        cls = word.partition("@")[2]
        return receiver == "self" and any(b.rpartition(".")[2] == cls for b in bases)
    return bool(receiver) and word in receiver.lower()


def function_entry(module: str, name: str, versions: Versions = ()) -> Installed | None:
    """The catalog entry a function imported from ``module`` makes, if any (installed)."""
    i = _FUNCTIONS.get(module, {}).get(name)
    return entries(versions).get(i) if i is not None else None
