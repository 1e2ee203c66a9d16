"""A device array's copy on its way to host memory (`Backend.start_to_host`).

The worker saves a finished stream's KV while the others decode: waiting on the engine thread for the copy
(~2 ms for the 4B's 11 MB of a 150-token turn, pageable memory) stalled every stream for as long, and a step
that ended eight streams stalled them 15 ms. A device backend only marks where the copy may start and returns;
whoever needs the bytes (the KV link's saver thread) calls `result()`, which makes the copy and waits for it.
"""

from __future__ import annotations

import numpy as np


class HostCopy:
    """A copy that is there already (a host backend's array)."""

    def __init__(self, array: np.ndarray) -> None:
        self._array = array

    def result(self) -> np.ndarray:
        """The host array (a device backend waits here for the copy to land)."""
        return self._array
