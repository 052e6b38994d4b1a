"""A state as a snapshot frame, and back (the workers' side; torch imported lazily).

``flatten`` walks dicts, lists and tuples and takes every tensor out, leaving a reference in its
place; the rest of the structure and the tensors' table are pickled into the frame's meta, the
tensors' bytes follow (``protocol``'s layout). ``write`` copies the tensors into a segment (the
copy is the whole cost of a snapshot: for a CUDA tensor a device-to-host copy straight into it);
``read`` copies them out into fresh tensors, so a restored state owns its memory and the keeper
may reuse the segment. Only the job's own processes ever unpickle a frame.
"""

from __future__ import annotations

import pickle
import warnings
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from elasticd.workers.snapshot_program.protocol import (
    HEADER,
    BadMessage,
    align,
    data_offset,
    header,
    parse_header,
)


@dataclass(frozen=True)
class Ref:
    """Where a tensor was in the state: its index in the table."""

    index: int


@dataclass(frozen=True)
class Entry:
    dtype: str  # e.g. "float32" (torch.<dtype>)
    shape: tuple[int, ...]
    offset: int  # from the start of the frame
    nbytes: int


@dataclass
class Plan:
    """A state taken apart: what ``write`` copies, and where."""

    tensors: list[Any]
    meta: bytes
    entries: list[Entry]
    total: int


def _take(obj: Any, tensors: list[Any]) -> Any:
    import torch

    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return Ref(len(tensors) - 1)
    if isinstance(obj, OrderedDict):  # a module's state_dict
        return OrderedDict((k, _take(v, tensors)) for k, v in obj.items())
    if type(obj) is dict:
        return {k: _take(v, tensors) for k, v in obj.items()}
    if type(obj) is list:
        return [_take(v, tensors) for v in obj]
    if type(obj) is tuple:
        return tuple(_take(v, tensors) for v in obj)
    return obj  # anything else is pickled as it is


def plan(state: Any) -> Plan:
    """The frame of ``state``: its meta, and each tensor's place (offsets are from the start of
    the data, which follows the meta: ``protocol.data_offset``)."""
    tensors: list[Any] = []
    skeleton = _take(state, tensors)
    dtypes = [str(t.dtype).removeprefix("torch.") for t in tensors]
    shapes = [tuple(t.shape) for t in tensors]
    sizes = [t.numel() * t.element_size() for t in tensors]
    offsets, at = [], 0
    for size in sizes:
        offsets.append(at)
        at = align(at + size)
    meta = pickle.dumps((skeleton, dtypes, shapes, offsets, sizes), protocol=pickle.HIGHEST_PROTOCOL)
    start = data_offset(len(meta))
    entries = [Entry(d, s, start + o, n) for d, s, o, n in zip(dtypes, shapes, offsets, sizes, strict=True)]
    return Plan(tensors, meta, entries, start + at)


def _bytes_view(buf: Any, offset: int, nbytes: int) -> Any:
    import torch

    with warnings.catch_warnings():  # a read-only mapping: we only ever read it
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(buf, dtype=torch.uint8, count=nbytes, offset=offset)


def write(p: Plan, step: int, buf: Any) -> None:
    """Copy the frame of ``p`` into ``buf`` (a writable mapping of at least ``p.total`` bytes).
    CUDA tensors go through ``device.copy_out`` (a stream of their own, pinned when ``buf`` is)."""
    start = align(HEADER.size)
    buf[start : start + len(p.meta)] = p.meta
    on_device = []
    for tensor, entry in zip(p.tensors, p.entries, strict=True):
        if entry.nbytes == 0:
            continue
        src = tensor.detach()
        if not src.is_contiguous():
            src = src.contiguous()
        dst = _bytes_view(buf, entry.offset, entry.nbytes)
        if src.is_cuda:
            on_device.append((dst, src.reshape(-1).view(dtype=_u8())))
        else:
            dst.copy_(src.reshape(-1).view(dtype=_u8()))
    if on_device:
        from elasticd.workers.snapshot_program import device

        device.copy_out(on_device)
    buf[0 : HEADER.size] = header(step, p.meta, p.total)


def on_device(p: Plan) -> bool:
    return any(getattr(t, "is_cuda", False) for t in p.tensors)


def _u8() -> Any:
    import torch

    return torch.uint8


def read(buf: Any, views: bool = False) -> tuple[int, Any]:
    """``(step, state)`` of the frame in ``buf``; tensors copied out unless ``views`` (then they are
    views of ``buf``, valid while it is mapped and unchanged: what a background persist writes)."""
    import torch

    step, meta_len, total, crc = parse_header(bytes(buf[0 : HEADER.size]))
    start = align(HEADER.size)
    meta = bytes(buf[start : start + meta_len])
    if zlib.crc32(meta) != crc or total > len(buf):
        raise BadMessage("the frame's meta does not match its checksum")
    skeleton, dtypes, shapes, offsets, sizes = pickle.loads(meta)
    base = data_offset(meta_len)
    tensors = []
    for dtype, shape, rel, nbytes in zip(dtypes, shapes, offsets, sizes, strict=True):
        offset = base + rel
        if offset + nbytes > total:
            raise BadMessage("a tensor lies outside the frame")
        kind = getattr(torch, dtype)
        if nbytes == 0:
            tensors.append(torch.empty(shape, dtype=kind))
            continue
        view = _bytes_view(buf, offset, nbytes).view(kind).view(shape)
        tensors.append(view if views else view.clone())
    return step, _put(skeleton, tensors)


def _put(obj: Any, tensors: list[Any]) -> Any:
    if isinstance(obj, Ref):
        return tensors[obj.index]
    if isinstance(obj, OrderedDict):
        return OrderedDict((k, _put(v, tensors)) for k, v in obj.items())
    if type(obj) is dict:
        return {k: _put(v, tensors) for k, v in obj.items()}
    if type(obj) is list:
        return [_put(v, tensors) for v in obj]
    if type(obj) is tuple:
        return tuple(_put(v, tensors) for v in obj)
    return obj
