"""The seam to the kernel's packet filter: ``Nft``, one table of elasticd's replaced in one
transaction, and ``NftCli``, which does it through ``nft -j`` (nftables' maintained JSON interface;
``portfilter.memory.MemoryNft`` is the fake that passes the same contract tests)."""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any, Protocol

from elasticd.portfilter.rules import FAMILY, TABLE, Json

NFT_TIMEOUT_S = 10.0  # one batch; the kernel commits it whole or not at all
MAX_ERROR = 400


class NftError(Exception):
    """``nft`` refused the batch, or could not be run. Nothing of the batch took effect."""


class Nft(Protocol):
    def apply(self, batch: list[Json]) -> None:
        """Run ``batch`` (``rules.commands``) as one transaction. Raises ``NftError``."""
        ...

    def table(self) -> list[Json] | None:
        """elasticd's table as nft lists it (its objects, the table itself first), None when
        there is none. Raises ``NftError``."""
        ...


class NftCli:
    """``nft -j -f -``: the batch on stdin, one netlink transaction."""

    def __init__(self, binary: str) -> None:
        self.binary = binary

    @classmethod
    def find(cls) -> NftCli | None:
        path = shutil.which("nft") or next(
            (p for p in ("/usr/sbin/nft", "/sbin/nft") if shutil.which(p)), None
        )
        return cls(path) if path else None

    def _run(self, args: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        try:
            done = subprocess.run(
                [self.binary, "-j", *args], input=stdin, capture_output=True, text=True, timeout=NFT_TIMEOUT_S
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise NftError(f"{self.binary}: {exc}") from exc
        return done

    def apply(self, batch: list[Json]) -> None:
        done = self._run(["-f", "-"], json.dumps({"nftables": batch}))
        if done.returncode != 0:
            raise NftError((done.stderr.strip() or f"exit {done.returncode}")[:MAX_ERROR])

    def table(self) -> list[Json] | None:
        done = self._run(["list", "table", FAMILY, TABLE])
        if done.returncode != 0:
            if "No such file or directory" in done.stderr:
                return None
            raise NftError((done.stderr.strip() or f"exit {done.returncode}")[:MAX_ERROR])
        try:
            listed: Any = json.loads(done.stdout)["nftables"]
        except (ValueError, KeyError, TypeError) as exc:
            raise NftError(f"nft listed something else than JSON: {exc}") from exc
        return [o for o in listed if isinstance(o, dict) and "metainfo" not in o]
