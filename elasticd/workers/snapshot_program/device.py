"""CUDA tensors into a snapshot segment: device-to-host through pinned memory, off the loop's stream.

A segment's mapping is registered with CUDA once (``cudaHostRegister``: its pages locked, so a copy
into it is DMA at the link's speed, rather than staged through a driver buffer as a copy into
pageable memory is). The copies run on a stream of their own that first waits for the loop's
current stream (they copy what the loop has computed so far), each ``non_blocking``; the call
returns once that stream is done, and the loop's stream never waits for it.
"""

from __future__ import annotations

from typing import Any

_STREAMS: dict[int, Any] = {}  # per device: the copy stream


def register(buf: Any) -> bool:
    """Lock ``buf``'s pages for CUDA (False: not possible here; copies stay pageable)."""
    import torch

    if not torch.cuda.is_available() or len(buf) == 0:
        return False
    ptr = torch.frombuffer(buf, dtype=torch.uint8, count=1).data_ptr()
    cuda: Any = torch.cuda  # (untyped in torch's stubs)
    err = cuda.cudart().cudaHostRegister(ptr, len(buf), 0)
    return int(err) == 0


def unregister(buf: Any) -> None:
    import torch

    ptr = torch.frombuffer(buf, dtype=torch.uint8, count=1).data_ptr()
    cuda: Any = torch.cuda
    cuda.cudart().cudaHostUnregister(ptr)


def copy_out(pairs: list[tuple[Any, Any]]) -> None:
    """Copy each CUDA ``src`` into its host ``dst`` on the device's copy stream; wait for them."""
    import torch

    streams = []
    for dst, src in pairs:
        index = src.device.index if src.device.index is not None else torch.cuda.current_device()
        stream = _STREAMS.get(index)
        if stream is None:
            cuda: Any = torch.cuda
            stream = _STREAMS[index] = cuda.Stream(device=index)
        if stream not in streams:
            stream.wait_stream(torch.cuda.current_stream(index))
            streams.append(stream)
        with torch.cuda.stream(stream):
            dst.copy_(src, non_blocking=True)
            src.record_stream(stream)  # the loop may free it meanwhile: not before the copy
    for stream in streams:
        stream.synchronize()
