"""Copies from the GPU to the host that neither the engine thread nor the steps after them wait for
(host_copy.py: a KV save while other streams decode).

`start_to_host` only records an event behind the work queued so far (the step that wrote the rows, the gather
that took them out of the pool); whoever asks for `result()` — the KV link's saver thread — makes the copy on a
stream of its own once that event has passed, and waits for it there. The engine's stream never waits for the
copy, and the source, a buffer of its own, is released when the copy is made.

What the engine thread must not meet is a long call into the CUDA driver on another thread: the driver
serializes them, and the engine's launches wait. A copy into pageable memory goes through the driver's own
staging buffers (eight at once, a burst of saves, held the engine's launches ~16 ms on the H200), and pinning a
new host block takes 0.4-0.7 ms a MB (eight 16 MB blocks: ~65 ms). So each copy goes in chunks through one pinned
staging buffer, pinned when the backend starts: the device-to-host copy of a chunk is a DMA the driver only
queues, and the copy from the staging buffer into the result's ordinary memory is NumPy's, outside the driver
and the GIL.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ...host_copy import HostCopy
from ...next_tokens import NextTokens

STAGING_BYTES = 16 << 20  # a 150-token turn of the 4B at INT8 KV is 11.5 MB: one chunk


class PinnedStaging:
    """One pinned host buffer the copies go through, one copy at a time."""

    def __init__(self, cupy: Any, nbytes: int = STAGING_BYTES) -> None:
        self.cp = cupy
        self.device = cupy.cuda.runtime.getDevice()  # the engine's: the copies run on other threads
        mem = cupy.cuda.alloc_pinned_memory(nbytes)
        self.buf = np.ndarray((nbytes,), dtype=np.uint8, buffer=mem)
        self.lock = threading.Lock()

    def copy(self, host: np.ndarray, source: Any, event: Any, stream: Any) -> None:
        """host[...] = source (a device array), once `event` has passed; waits on `stream` only."""
        rt = self.cp.cuda.runtime
        dst = host.reshape(-1).view(np.uint8)
        size = self.buf.size
        with self.lock, self.cp.cuda.Device(self.device):
            stream.wait_event(event)
            for at in range(0, source.nbytes, size):
                n = min(size, source.nbytes - at)
                rt.memcpyAsync(self.buf.ctypes.data, source.data.ptr + at, n, rt.memcpyDeviceToHost, stream.ptr)
                stream.synchronize()
                dst[at : at + n] = self.buf[:n]


class DeferredHostCopy(HostCopy):
    def __init__(self, source: Any, event: Any, stream: Any, staging: PinnedStaging) -> None:
        super().__init__(np.empty(0, dtype=source.dtype))
        self._source: Any | None = source
        self._event = event  # recorded on the engine's stream after the work that wrote `source`
        self._stream = stream
        self._staging = staging

    def result(self) -> np.ndarray:
        if self._source is not None:
            host = np.empty(self._source.shape, dtype=self._source.dtype)
            self._staging.copy(host, self._source, self._event, self._stream)
            self._array, self._source = host, None
        return self._array


def start_to_host(cupy: Any, x: Any, stream: Any, staging: PinnedStaging) -> HostCopy:
    x = cupy.ascontiguousarray(x)
    event = cupy.cuda.Event(disable_timing=True)
    event.record()  # on the current stream: behind what wrote x
    return DeferredHostCopy(x, event, stream, staging)


class DeviceTokens(NextTokens):
    """A step's greedy tokens on the device (`device`: int32 [k], argmax_rows's), their copy back into `pinned`
    queued on the current stream behind the launch that computes them: nothing waits for them until `tokens()`."""

    def __init__(self, cupy: Any, device: Any, pinned: np.ndarray) -> None:
        super().__init__([])
        self.device = device
        self._host = pinned[: device.size]
        stream = cupy.cuda.get_current_stream()
        rt = cupy.cuda.runtime
        rt.memcpyAsync(self._host.ctypes.data, device.data.ptr, device.nbytes, rt.memcpyDeviceToHost, stream.ptr)
        self._event = cupy.cuda.Event(disable_timing=True)
        self._event.record(stream)
        self._read = False

    def tokens(self) -> list[int]:
        if not self._read:
            self._event.synchronize()
            self._tokens, self._read = [int(t) for t in self._host], True
        return self._tokens
