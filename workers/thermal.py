"""Heat: the worker slows down when its device runs hot, until it has cooled (issue 18).

A Jetson next to Home Assistant is passively cooled; decoding flat out heats it until the firmware throttles
its clocks, for everyone. The worker acts first: above `throttle_c` it pauses between steps as long as a step
took (half its speed) and admits no new stream while one runs (those running go on), until the temperature is
at or below `resume_c` (the gap keeps it from flapping). The
temperature comes from the first source that answers: a file named by the daemon's `thermal_sensor`
(GENIE_THERMAL_SENSOR; millidegrees, as Linux writes them), NVML (the `nvidia-ml-py` package, on a GPU with
it installed), else the hottest of Linux's thermal zones. No source, or one that stops answering for
UNREADABLE_POLLS polls: no temperature, not throttled (a lost sensor must not halve the speed for good).
"""

from __future__ import annotations

import glob
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("genie.worker")

THERMAL_ZONES = "/sys/class/thermal/thermal_zone*/temp"
MAX_PAUSE_S = 0.5  # a throttled step's pause is at most this: a voice answer still moves
UNREADABLE_POLLS = 5  # reads in a row that fail before the last reading is given up


def read_millidegrees(path: str) -> float | None:
    """°C from a file holding millidegrees (Linux thermal zones), None when it cannot be read."""
    try:
        with open(path, encoding="ascii") as f:
            return int(f.read().strip()) / 1000.0
    except (OSError, ValueError):
        return None


def nvml_sensor() -> Callable[[], float | None] | None:
    """The first GPU's temperature through NVML, when nvidia-ml-py and a driver are there."""
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    except Exception:  # no package, no driver, no device: the next source
        return None

    def read() -> float | None:
        try:
            return float(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU))
        except Exception:
            return None

    return read


def zones_sensor() -> Callable[[], float | None] | None:
    paths = sorted(glob.glob(THERMAL_ZONES))
    if not paths:
        return None

    def read() -> float | None:
        temps = [t for t in (read_millidegrees(p) for p in paths) if t is not None]
        return max(temps) if temps else None

    return read


def find_sensor(path: str, gpu: bool) -> tuple[str, Callable[[], float | None] | None]:
    """(what it reads, the reader) of the first source there is."""
    if path:
        return path, lambda: read_millidegrees(path)
    reader = nvml_sensor() if gpu else None
    if reader is not None:
        return "nvml", reader
    reader = zones_sensor()
    return ("thermal zones", reader) if reader is not None else ("none", None)


@dataclass
class ThermalState:
    temp_c: float | None = None
    throttled: bool = False


class ThermalGovernor:
    """Polled once a second (the worker's I/O thread); read by the engine thread between steps."""

    def __init__(self, read: Callable[[], float | None] | None, throttle_c: float, resume_c: float) -> None:
        if not resume_c < throttle_c:
            raise ValueError(f"thermal_resume_c ({resume_c}) must be below thermal_throttle_c ({throttle_c})")
        self.read = read
        self.throttle_c = throttle_c
        self.resume_c = resume_c
        self.state = ThermalState()
        self._lock = threading.Lock()
        self._unread = 0  # failed reads in a row
        self.paused_steps = 0  # steps the worker paused after, since it started (the engine thread counts)

    def poll(self) -> ThermalState:
        temp = self.read() if self.read is not None else None
        with self._lock:
            was = self.state.throttled
            throttled = was
            self._unread = 0 if temp is not None else self._unread + 1
            if temp is not None:
                throttled = temp > self.throttle_c or (was and temp > self.resume_c)
            elif self._unread >= UNREADABLE_POLLS:
                throttled = False
            self.state = ThermalState(temp, throttled)
        if throttled != was:
            log.warning("event=%s temp_c=%s", "thermal_throttle" if throttled else "thermal_resume", temp)
        return self.state

    @property
    def throttled(self) -> bool:
        return self.state.throttled

    def pause_s(self, step_s: float) -> float:
        """How long to wait after a step that took `step_s`: as long again while throttled (half speed)."""
        if not self.state.throttled:
            return 0.0
        self.paused_steps += 1
        return min(step_s, MAX_PAUSE_S)

    def report(self) -> dict[str, object]:
        s = self.state
        temp = None if s.temp_c is None else round(s.temp_c, 1)
        return {"temp_c": temp, "throttled": s.throttled, "paused_steps": self.paused_steps}
