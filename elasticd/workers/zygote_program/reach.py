"""Whether a job's script can reach torch: its warm parent imports torch only if it may.

Importing torch (and what its first steps load) costs a warm parent ~2.5 s of CPU and ~300 MB on
every node of the job. A script whose every import, read from its source, is the standard
library's or a local module's (a file beside it, read the same way, transitively) cannot load
torch but through a dynamic import, so its parent skips torch and is ready in milliseconds.
Anything else means it may, and the parent imports torch as always: a package that is not the
standard library's, a dynamic import (``__import__``, ``exec``, ``importlib``, ``runpy``...), a
file that cannot be read or parsed, a local module that cannot be found, more files or bytes than
the bounds, an interpreter that does not list its standard library (before 3.10), ``-m``. A wrong
"cannot" would cost speed, never correctness: the worker imports torch itself after the fork.

The files read to say "cannot" are stamped with the parent's modules (``stamps``): a parked
parent without torch is not adopted by a job whose script has since learnt to import it.

A part of the zygote's program (``warm.spawn.BOOT_PARTS``): standard library only, run in the
job's interpreter, as the submitter (the daemon never opens a user's files).
"""

from __future__ import annotations

import ast
import os
import sys

MAX_FILES = 64  # local modules read, the script included
MAX_BYTES = 1 << 20  # per file
DYNAMIC_MODULES = frozenset({"importlib", "imp", "runpy", "pkgutil", "zipimport", "code", "codeop"})
DYNAMIC_CALLS = frozenset({"__import__", "exec", "eval", "compile"})


class _MayReach(Exception):
    """Something in the script's imports that could load torch (or that could not be read)."""


def cannot_reach_torch(kind: str, entry: str, path0: str) -> list[str] | None:
    """The local files read (the script first) when the script cannot import torch; None when it
    may, or when that cannot be told."""
    stdlib = getattr(sys, "stdlib_module_names", None)
    if kind != "script" or stdlib is None:
        return None
    known = frozenset(stdlib) | frozenset(sys.builtin_module_names)
    todo, read = [os.path.realpath(entry)], list[str]()
    try:
        while todo:
            path = todo.pop()
            if path in read:
                continue
            if len(read) >= MAX_FILES:
                raise _MayReach(f"more than {MAX_FILES} local files")
            read.append(path)
            todo += _local_imports(path, path0, known)
    except _MayReach:
        return None
    return read


def _local_imports(path: str, path0: str, stdlib: frozenset[str]) -> list[str]:
    """The local files ``path`` imports; raises ``_MayReach`` at anything else but the standard
    library."""
    tree = _parse(path)
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in DYNAMIC_CALLS:
            raise _MayReach(f"{node.func.id}() in {path}")
        if isinstance(node, ast.Import):
            for alias in node.names:
                found += _resolve(alias.name.split("."), path0, stdlib, ())
        elif isinstance(node, ast.ImportFrom):
            names = tuple(a.name for a in node.names if a.name != "*")
            if node.level:
                base = os.path.dirname(path)
                for _ in range(node.level - 1):
                    base = os.path.dirname(base)
                parts = node.module.split(".") if node.module else []
                found += _local(base, parts, names) if parts else _submodules(base, names)
            else:
                found += _resolve((node.module or "").split("."), path0, stdlib, names)
    return found


def _parse(path: str) -> ast.AST:
    try:
        with open(path, "rb") as f:
            source = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise _MayReach(str(exc)) from None
    if len(source) > MAX_BYTES:
        raise _MayReach(f"{path} is over {MAX_BYTES} bytes")
    try:
        return ast.parse(source, path)
    except (SyntaxError, ValueError) as exc:
        raise _MayReach(str(exc)) from None


def _resolve(parts: list[str], path0: str, stdlib: frozenset[str], names: tuple[str, ...]) -> list[str]:
    """An absolute import: a local module's files (``path0`` comes first on ``sys.path``, so a
    local file shadows the standard library's), nothing for the standard library's."""
    top = parts[0]
    if os.path.isfile(os.path.join(path0, top + ".py")) or os.path.isdir(os.path.join(path0, top)):
        return _local(path0, parts, names)
    if top in stdlib and top not in DYNAMIC_MODULES:
        return []
    raise _MayReach(f"import {'.'.join(parts)}")


def _local(base: str, parts: list[str], names: tuple[str, ...]) -> list[str]:
    """The files of local module ``parts`` under ``base`` (each package's ``__init__`` on the way),
    and of those ``names`` imported from it that are submodules."""
    files, here = [], base
    for i, part in enumerate(parts):
        module, package = os.path.join(here, part + ".py"), os.path.join(here, part)
        if os.path.isdir(package):
            init = os.path.join(package, "__init__.py")
            files += [init] if os.path.isfile(init) else []
            here = package
        elif os.path.isfile(module) and i == len(parts) - 1:
            return [*files, module]
        else:
            raise _MayReach(f"no local module {'.'.join(parts)} under {base}")
    return files + _submodules(here, names)


def _submodules(package: str, names: tuple[str, ...]) -> list[str]:
    """The files of those ``names`` that are modules of ``package`` (the others are its names)."""
    found = []
    for name in names:
        module, sub = os.path.join(package, name + ".py"), os.path.join(package, name, "__init__.py")
        found += [module] if os.path.isfile(module) else [sub] if os.path.isfile(sub) else []
    return found
