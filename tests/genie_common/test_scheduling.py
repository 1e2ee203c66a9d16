"""Each genie process's scheduler slice (genie_common/scheduling.py): the daemon and the KV store the least, the
worker the kernel's own, on kernels that give ordinary threads a slice of their own (6.12 and later)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from genie_common import scheduling


def run(code: str) -> str:
    """`code` in a fresh interpreter (the test process keeps its own slice); what it prints."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def kernel_default() -> int | None:
    """The kernel's own slice: what a fresh process has after `compute()` (this one may have called
    `latency_sensitive()` in an earlier test, through a daemon's main run in-process, and a child inherits it)."""
    out = run("from genie_common import scheduling as s; s.compute(); print(s.slice_ns())")
    return None if out == "None" else int(out)


DEFAULT = kernel_default()
needs_slices = pytest.mark.skipif(not DEFAULT, reason="this kernel gives ordinary threads no slice of their own")


@needs_slices
def test_latency_sensitive_threads_and_children_get_the_least_slice_and_compute_takes_the_default_back():
    out = run(
        """
        import subprocess, sys, threading
        from genie_common import scheduling as s
        assert s.latency_sensitive()
        seen = []
        t = threading.Thread(target=lambda: seen.append(s.slice_ns()))
        t.start(); t.join()
        child = subprocess.run([sys.executable, "-c", "from genie_common import scheduling as s; print(s.slice_ns())"],
                               capture_output=True, text=True, check=True).stdout.strip()
        mine = s.slice_ns()
        assert s.compute()
        print(mine, seen[0], child, s.slice_ns())
        """
    )
    mine, thread, child, after = map(int, out.split())
    short = scheduling.SHORT_SLICE_NS
    assert (mine, thread, child) == (short, short, short)
    assert after == DEFAULT != short


@needs_slices
def test_the_nice_value_is_kept():
    out = run(
        """
        import os
        from genie_common import scheduling as s
        os.nice(5)
        s.latency_sensitive()
        print(os.getpriority(os.PRIO_PROCESS, 0), s.slice_ns())
        """
    )
    assert out.split() == ["5", str(scheduling.SHORT_SLICE_NS)]


def test_another_policy_is_left_as_it_is():
    out = run(
        """
        import os
        from genie_common import scheduling as s
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        print(s.latency_sensitive(), os.sched_getscheduler(0) == os.SCHED_BATCH)
        """
    )
    assert out.split() == ["False", "True"]
