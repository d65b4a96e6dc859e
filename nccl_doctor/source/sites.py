"""Where a module makes collectives (pure, from its ``ast``): the calls of torch.distributed's
collectives under the names the module imported them by, and the calls of the user's own
functions that make one, directly or through another of them.

A name is resolved only where the module says what it is: ``dist.all_reduce`` where ``dist`` is
``torch.distributed`` (or ``torch.distributed.distributed_c10d``, the functional collectives),
``all_reduce`` imported from there, ``torch.distributed.all_reduce`` spelled out. A function of
the user's is called by its bare name (a function of the same file, or imported from another
file checked) or as ``self.name`` inside its class: ``obj.step()`` could be any object's and is
not followed. Sends and receives are not collectives here: a pipeline's stage split
(``if rank == 0: send ... else: recv``) is the design (docs/p2p.md)."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

#: torch.distributed's calls every rank of the group must make
COLLECTIVES = frozenset({
    "all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor",
    "all_gather_coalesced", "all_gather_object", "all_gather_tensor", "broadcast",
    "broadcast_object_list", "reduce", "reduce_scatter", "reduce_scatter_tensor",
    "all_to_all", "all_to_all_single", "barrier", "monitored_barrier", "gather",
    "gather_object", "scatter", "scatter_object_list", "new_group", "new_subgroups",
    "new_subgroups_by_enumeration", "split_group",
    "init_device_mesh",  # (it creates a group per mesh dimension: new_group on every rank)
})
DIST_MODULES = frozenset({
    "torch.distributed", "torch.distributed.distributed_c10d",
    "torch.distributed._functional_collectives", "torch.distributed.nn.functional",
    "torch.distributed.device_mesh",
})
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef)


@dataclass(frozen=True)
class Site:
    """A call that makes collectives: a collective itself, or a function of the user's."""

    path: str
    line: int
    col: int  # 0-based, as ast gives it
    call: str  # as written
    function: str  # the enclosing def's name ("<module>" at the top level)
    collective: str  # the collective it makes ("all_reduce"); a user function's: "path:line call"
    user: bool = False  # a call of a function of the user's (ND002)


@dataclass
class Module:
    """One file's collective calls and functions, before the functions are followed."""

    path: str
    tree: ast.Module
    sites: list[Site] = field(default_factory=list)
    #: each def (bare name, class name or None) -> the collectives made directly in its body
    makes: dict[tuple[str, str | None], Site] = field(default_factory=dict)
    #: calls of names that may be the user's: (callee, class of ``self`` or None, the call site,
    #: the def (name, class) whose body makes it, or None at the top level)
    calls: list[tuple[str, str | None, Site, tuple[str, str | None] | None]] = field(
        default_factory=list)
    #: names imported from other modules: local name -> (module, name)
    imported: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: every module name it imports, and each name imported from one (``pkg.config``)
    imports: set[str] = field(default_factory=set)
    #: each class -> its base classes, as written (``L.LightningModule``)
    bases: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: the libraries' versions the catalog is matched by (none: those installed here)
    versions: tuple[tuple[str, str], ...] = ()


def read_module(path: str, tree: ast.Module, versions: tuple[tuple[str, str], ...] = ()
                ) -> Module:
    """``versions``: the libraries' versions the catalog is matched by (source/catalog_calls.py;
    none: those installed here)."""
    mod = Module(path, tree, versions=versions)
    aliases = _aliases(tree, mod)
    _walk(tree, mod, aliases, "<module>", None, None)
    return mod


def _aliases(tree: ast.Module, mod: Module) -> dict[str, str]:
    """Local name -> the dotted name it stands for (modules and functions imported)."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mod.imports.update(a.name for a in node.names)
            for a in node.names:
                if a.asname:
                    out[a.asname] = a.name
                else:
                    out[a.name.split(".")[0]] = a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            mod.imports.update([node.module, *(f"{node.module}.{a.name}" for a in node.names)])
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
                mod.imported[a.asname or a.name] = (node.module, a.name)
        elif isinstance(node, ast.ImportFrom) and node.level:
            mod.imports.update([node.module or "", *(a.name for a in node.names)])
            for a in node.names:  # (a relative import: one of the user's modules)
                mod.imported[a.asname or a.name] = ("." * node.level + (node.module or ""),
                                                    a.name)
    return out


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def resolved(func: ast.AST, aliases: dict[str, str]) -> tuple[str, str] | None:
    """(module, name) a called name stands for through the module's imports
    (``dist.all_reduce`` -> ("torch.distributed", "all_reduce")), or None."""
    dotted = _dotted(func)
    if dotted is None:
        return None
    head, _, rest = dotted.partition(".")
    full = aliases.get(head, head) + (f".{rest}" if rest else "")
    module, _, name = full.rpartition(".")
    return module, name


def collective_of(func: ast.AST, aliases: dict[str, str]) -> str | None:
    """The collective ``func`` names (``dist.all_reduce`` -> "all_reduce"), or None."""
    found = resolved(func, aliases)
    return found[1] if found and found[1] in COLLECTIVES and found[0] in DIST_MODULES else None


def _catalogued(call: ast.Call, aliases: dict[str, str], bases: tuple[str, ...] = (),
                versions: tuple[tuple[str, str], ...] = ()):
    """The catalog entry (source/catalog_calls.py) a library call makes, if any. ``bases``: the
    base classes of the class whose method makes the call."""
    from nccl_doctor.source import catalog_calls as catalog

    func = call.func
    if isinstance(func, ast.Attribute):
        true = frozenset(k.arg for k in call.keywords if k.arg and isinstance(
            k.value, ast.Constant) and k.value.value is True)
        found = catalog.method_entry(func.attr, _dotted(func.value), true, bases, versions)
        if found is not None:
            return found
    found = resolved(func, aliases)
    return catalog.function_entry(*found, versions) if found is not None else None


def _walk(node: ast.AST, mod: Module, aliases: dict[str, str], function: str,
          owner: tuple[str, str | None] | None, cls: str | None) -> None:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.ClassDef):
            mod.bases[child.name] = tuple(d for b in child.bases if (d := _dotted(b)))
            _walk(child, mod, aliases, function, owner, child.name)
            continue
        if isinstance(child, _DEFS):
            # (the qualname, as the run's frames name a method: its class's fields are read)
            qualname = f"{cls}.{child.name}" if cls is not None and owner is None else child.name
            _walk(child, mod, aliases, qualname, (child.name, cls), cls)
            continue
        if isinstance(child, ast.Call):
            text = _dotted(child.func) or ""
            name = collective_of(child.func, aliases)
            if name is not None:
                site = Site(mod.path, child.lineno, child.col_offset, text, function, name)
                mod.sites.append(site)
                if owner is not None:
                    mod.makes.setdefault(owner, site)
            elif (entry := _catalogued(child, aliases, mod.bases.get(cls, ()),
                                       mod.versions)) is not None:
                site = Site(mod.path, child.lineno, child.col_offset, text, function,
                            f"catalog:{entry.id}")
                mod.sites.append(site)
                if owner is not None:
                    mod.makes.setdefault(owner, site)
            elif isinstance(child.func, ast.Name):
                mod.calls.append((child.func.id, None, Site(
                    mod.path, child.lineno, child.col_offset, text, function, "", True), owner))
            elif (isinstance(child.func, ast.Attribute) and isinstance(child.func.value, ast.Name)
                  and child.func.value.id == "self" and cls is not None):
                mod.calls.append((child.func.attr, cls, Site(
                    mod.path, child.lineno, child.col_offset, text, function, "", True), owner))
        _walk(child, mod, aliases, function, owner, cls)


def user_sites(modules: list[Module], depth: int = 4) -> list[Site]:
    """The calls of the user's functions that make collectives (directly, or through others of
    theirs up to ``depth`` calls deep), each with the collective it leads to."""
    makes: dict[tuple[str, str, str | None], Site] = {}  # (path, def, class) -> a collective
    stems = {Path(m.path).stem for m in modules}
    for mod in modules:
        for key, site in mod.makes.items():
            makes.setdefault((mod.path, *key), site)
    by_stem = {Path(m.path).stem: m.path for m in modules}

    def target_of(mod: Module, callee: str, cls: str | None) -> Site | None:
        """The def a call names: a method of ``self``'s class, a function of the same file, or
        one imported by name from another file checked."""
        if cls is not None:
            return makes.get((mod.path, callee, cls))
        found = makes.get((mod.path, callee, None))
        if found is None and callee in mod.imported:
            module, name = mod.imported[callee]
            stem = module.rpartition(".")[2]
            if stem in stems:
                found = makes.get((by_stem[stem], name, None))
        return found

    for _ in range(depth):  # a function that calls one that makes collectives makes them
        grown = False
        for mod in modules:
            for callee, cls, site, owner in mod.calls:
                target = target_of(mod, callee, cls)
                if target is not None and owner is not None and (mod.path, *owner) not in makes:
                    makes[(mod.path, *owner)] = target
                    grown = True
        if not grown:
            break
    out = []
    for mod in modules:
        for callee, cls, site, _ in mod.calls:
            target = target_of(mod, callee, cls)
            if target is not None:
                via = f"{target.path}:{target.line} {target.call}"
                out.append(Site(site.path, site.line, site.col, site.call, site.function,
                                via, True))
    return out
