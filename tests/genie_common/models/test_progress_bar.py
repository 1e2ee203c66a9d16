"""`genie pull`'s progress display: a bar with bytes and rate on a terminal, a line per step otherwise."""

from __future__ import annotations

import io

from genie_common.models.progress_bar import ProgressBar
from genie_common.models.pull import PullProgress

STEPS = [
    PullProgress("pulling manifest"),
    PullProgress("downloading", 4_000_000, 1_000_000),
    PullProgress("downloading", 4_000_000, 2_000_000),
    PullProgress("downloading", 4_000_000, 4_000_000),
    PullProgress("verifying sha256 digest"),
    PullProgress("writing manifest"),
    PullProgress("success"),
]


def test_terminal_gets_a_bar_with_bytes_and_rate() -> None:
    out = io.StringIO()
    bar = ProgressBar(out, is_tty=True)
    for step in STEPS:
        bar(step)
    text = out.getvalue()
    frames = text.split("\r")[1:]
    assert len(frames) == 3 and "100%" in frames[-1] and "4.0 MB / 4.0 MB" in frames[-1]
    assert all("MB/s" in f for f in frames)
    # the bar's line is ended before the next step is written
    assert text.endswith("\nverifying sha256 digest\nwriting manifest\nsuccess\n")


def test_a_pipe_gets_one_line_per_step() -> None:
    out = io.StringIO()
    bar = ProgressBar(out, is_tty=False)
    for step in STEPS:
        bar(step)
    assert "\r" not in out.getvalue()
    assert out.getvalue().splitlines() == [
        "pulling manifest",
        "downloading (4.0 MB, resuming at 1.0 MB)",
        "verifying sha256 digest",
        "writing manifest",
        "success",
    ]
