"""An in-memory ``Nft`` for tests: it keeps elasticd's table as a batch leaves it, refuses what
the real one refuses that the daemon could send (a rule in a chain or a set lookup of neither),
and lists it in nft's shape (the table, then sets, chains, rules)."""

from __future__ import annotations

from typing import Any

from elasticd.portfilter.nft import NftError
from elasticd.portfilter.rules import FAMILY, TABLE, Json


class MemoryNft:
    def __init__(self) -> None:
        self._objects: list[Json] | None = None
        self.batches = 0  # transactions that took
        self.fail_next: str | None = None  # a test's refusal of the next batch

    def apply(self, batch: list[Json]) -> None:
        if self.fail_next is not None:
            why, self.fail_next = self.fail_next, None
            raise NftError(why)
        objects = None if self._objects is None else list(self._objects)
        for cmd in batch:
            objects = _one(objects, cmd)
        self._objects = objects
        self.batches += 1

    def table(self) -> list[Json] | None:
        return None if self._objects is None else [dict(o) for o in self._objects]


def _mine(obj: dict[str, Any]) -> bool:
    return obj.get("family") == FAMILY and obj.get("table", obj.get("name")) == TABLE


def _one(objects: list[Json] | None, cmd: Json) -> list[Json] | None:
    ((verb, body),) = cmd.items()
    ((kind, obj),) = body.items()
    if not _mine(obj):
        raise NftError(f"{kind} outside elasticd's table: {obj.get('family')} {obj.get('table')}")
    if kind == "table":
        if verb == "delete":
            if objects is None:
                raise NftError("No such file or directory: the table")
            return None
        return objects if objects is not None else [{"table": {"family": FAMILY, "name": TABLE}}]
    if objects is None:
        raise NftError(f"{kind} in a table that does not exist")
    names = {(k, o.get("name")) for item in objects for k, o in item.items()}
    if kind == "rule":
        if ("chain", obj["chain"]) not in names:
            raise NftError(f"no chain {obj['chain']}")
        for ref in _set_refs(obj["expr"]):
            if ("set", ref) not in names:
                raise NftError(f"no set {ref}")
    elif (kind, obj.get("name")) in names:
        raise NftError(f"{kind} {obj.get('name')} exists")
    return [*objects, {kind: obj}]


def _set_refs(value: Any) -> list[str]:
    if isinstance(value, str) and value.startswith("@"):
        return [value[1:]]
    if isinstance(value, dict):
        return [r for v in value.values() for r in _set_refs(v)]
    if isinstance(value, list):
        return [r for v in value for r in _set_refs(v)]
    return []
