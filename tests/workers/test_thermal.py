"""The heat governor (workers/thermal.py): hysteresis between the throttle and resume temperatures, the
pause it asks for, and the sources it reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from genie_workers.thermal import MAX_PAUSE_S, ThermalGovernor, find_sensor, read_millidegrees


def test_throttles_above_and_resumes_at_or_below_with_a_gap_between() -> None:
    temps = iter([65.0, 85.0, 75.0, None, 70.0, 79.0, 80.5])
    g = ThermalGovernor(lambda: next(temps), throttle_c=80.0, resume_c=70.0)
    seen = [g.poll().throttled for _ in range(7)]
    # 65 cool; 85 hot; 75 still hot (above resume); unreadable keeps the state; 70 cool; 79 cool; 80.5 hot
    assert seen == [False, True, True, True, False, False, True]
    assert g.pause_s(0.02) == 0.02 and g.pause_s(3.0) == MAX_PAUSE_S
    assert g.report() == {"temp_c": 80.5, "throttled": True, "paused_steps": 2}


def test_a_sensor_that_stops_answering_releases_the_throttle() -> None:
    temps = iter([90.0, None, None, None, None, None])
    g = ThermalGovernor(lambda: next(temps), throttle_c=80.0, resume_c=70.0)
    seen = [g.poll().throttled for _ in range(6)]
    assert seen == [True, True, True, True, True, False]  # UNREADABLE_POLLS (5) failed reads in a row


def test_no_source_no_throttle_and_a_bad_range_is_refused() -> None:
    g = ThermalGovernor(None, 80.0, 70.0)
    assert not g.poll().throttled and g.pause_s(1.0) == 0.0
    assert g.report() == {"temp_c": None, "throttled": False, "paused_steps": 0}
    with pytest.raises(ValueError, match="must be below"):
        ThermalGovernor(None, 70.0, 70.0)


def test_a_sensor_file_of_millidegrees(tmp_path: Path) -> None:
    f = tmp_path / "temp"
    f.write_text("85000\n")
    source, read = find_sensor(str(f), gpu=False)
    assert source == str(f) and read is not None and read() == 85.0
    f.write_text("garbage")
    assert read() is None and read_millidegrees(str(tmp_path / "absent")) is None
