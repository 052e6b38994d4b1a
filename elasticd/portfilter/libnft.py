"""``NftLib``: the ``Nft`` seam through libnftables in this process (``libnftables.so.1``, the
library ``nft`` itself is a front end of, as Debian's python3-nftables uses it), by ctypes.

Why not ``nft -j -f -``: a process per change costs ~24 ms, mostly the process's start and the
library's load, and the change is made before a round's workers start. In-process, a batch is
one JSON parse and one netlink transaction (well under a millisecond for a job's 16 rules). The
same JSON, the same transaction: ``NftCli`` stays the fallback where the library is missing.

A context is not thread-safe: one lock serialises the calls (``PortFilter`` already sends one
batch at a time, from a worker thread)."""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import threading
from typing import Any

from elasticd.portfilter.nft import MAX_ERROR, NftError
from elasticd.portfilter.rules import FAMILY, TABLE, Json

LIBRARY = "libnftables.so.1"
OUTPUT_JSON = 1 << 4  # NFT_CTX_OUTPUT_JSON (nftables/libnftables.h)
CTX_DEFAULT = 0


def _bind(lib: ctypes.CDLL) -> None:
    """Declare the few calls used, so ctypes passes pointers whole on 64-bit."""
    lib.nft_ctx_new.restype, lib.nft_ctx_new.argtypes = ctypes.c_void_p, [ctypes.c_uint32]
    lib.nft_ctx_free.restype, lib.nft_ctx_free.argtypes = None, [ctypes.c_void_p]
    lib.nft_ctx_output_set_flags.restype = None
    lib.nft_ctx_output_set_flags.argtypes = [ctypes.c_void_p, ctypes.c_uint]
    for name in ("nft_ctx_buffer_output", "nft_ctx_buffer_error"):
        getattr(lib, name).restype, getattr(lib, name).argtypes = ctypes.c_int, [ctypes.c_void_p]
    for name in ("nft_ctx_get_output_buffer", "nft_ctx_get_error_buffer"):
        getattr(lib, name).restype, getattr(lib, name).argtypes = ctypes.c_char_p, [ctypes.c_void_p]
    lib.nft_run_cmd_from_buffer.restype = ctypes.c_int
    lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]


class NftLib:
    """One libnftables context for the daemon's life, its output and errors kept in buffers."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        _bind(lib)
        ctx = lib.nft_ctx_new(CTX_DEFAULT)
        if not ctx:
            raise NftError("nft_ctx_new failed")
        lib.nft_ctx_output_set_flags(ctx, OUTPUT_JSON)
        if lib.nft_ctx_buffer_output(ctx) != 0 or lib.nft_ctx_buffer_error(ctx) != 0:
            lib.nft_ctx_free(ctx)
            raise NftError("libnftables cannot buffer its output")
        self._lib = lib
        self._ctx: int | None = ctx
        self._lock = threading.Lock()

    @classmethod
    def find(cls) -> NftLib | None:
        """The library if this host has it (Debian: libnftables1), else None."""
        try:
            return cls(ctypes.CDLL(ctypes.util.find_library("nftables") or LIBRARY))
        except (OSError, AttributeError, NftError):
            return None

    def _run(self, command: str) -> tuple[int, str, str]:
        with self._lock:
            if self._ctx is None:
                raise NftError("libnftables context closed")
            rc = self._lib.nft_run_cmd_from_buffer(self._ctx, command.encode())
            out = self._lib.nft_ctx_get_output_buffer(self._ctx) or b""
            err = self._lib.nft_ctx_get_error_buffer(self._ctx) or b""
        return rc, out.decode(errors="replace"), err.decode(errors="replace")

    def apply(self, batch: list[Json]) -> None:
        rc, _, err = self._run(json.dumps({"nftables": batch}))
        if rc != 0:
            raise NftError((err.strip() or f"libnftables: {rc}")[:MAX_ERROR])

    def table(self) -> list[Json] | None:
        rc, out, err = self._run(f"list table {FAMILY} {TABLE}")
        if rc != 0:
            if "No such file or directory" in err:
                return None
            raise NftError((err.strip() or f"libnftables: {rc}")[:MAX_ERROR])
        try:
            listed: Any = json.loads(out)["nftables"]
        except (ValueError, KeyError, TypeError) as exc:
            raise NftError(f"libnftables listed something else than JSON: {exc}") from exc
        return [o for o in listed if isinstance(o, dict) and "metainfo" not in o]

    def close(self) -> None:
        with self._lock:
            if self._ctx is not None:
                self._lib.nft_ctx_free(self._ctx)
                self._ctx = None
