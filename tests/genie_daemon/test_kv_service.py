"""Persistent KV through the real processes: daemon, worker, KV store. A conversation saved at turn end
and hydrated after a daemon restart continues with exactly the tokens of an uninterrupted run."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from genie_protocol.client import GenieClient
from genie_protocol.messages import Done
from tests.genie_daemon.test_daemon import collect, ctl, start_daemon

PROMPT = [1] + [3 + (7 * i) % 290 for i in range(120)]
FOLLOW_UP = [5 + i for i in range(12)]
GREEDY = {"temperature": 0.0, "max_tokens": 20, "ignore_eos": True}


def turn(endpoint: str, token_ids: list[int], conv_id: str | None) -> tuple[list[int], Done]:
    async def go():
        async with GenieClient(endpoint, timeout_s=60) as client:
            return await collect(client, token_ids=token_ids, params=GREEDY, conv_id=conv_id)

    deltas, end = asyncio.run(go())
    assert isinstance(end, Done), end
    return [t for d in deltas for t in d.token_ids], end


def turn_text(endpoint: str, prompt: str, conv_id: str | None, max_tokens: int = 12) -> tuple[str, Done]:
    """One greedy turn on a text prompt: its answer and DONE."""

    async def go():
        async with GenieClient(endpoint, timeout_s=120) as client:
            params = {"temperature": 0.0, "max_tokens": max_tokens}
            return await collect(client, prompt=prompt, params=params, conv_id=conv_id)

    deltas, end = asyncio.run(go())
    assert isinstance(end, Done), end
    return "".join(d.text for d in deltas), end


def stop(proc) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == 0


def wait_for_entries(sock_dir: Path, n: int, timeout_s: float = 10) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        r = ctl(sock_dir, "--json", "kv", "ls")
        entries = json.loads(r.stdout)["entries"] if r.returncode == 0 else []
        if len(entries) >= n:
            return entries
        time.sleep(0.1)
    raise AssertionError(f"no saved entry appeared: {r.stdout} {r.stderr}")


@pytest.mark.parametrize("kv", ["int8", "fp16"])
def test_conversation_continues_exactly_after_a_daemon_restart(tmp_path, kv):
    extra = ("--fp16-kv",) if kv == "fp16" else ()
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
    # uninterrupted: both turns on one daemon; the second reuses the KV the first left in the worker
    proc, endpoint = start_daemon(tmp_path / "a", *extra)
    try:
        first, _ = turn(endpoint, PROMPT, "den")
        history = PROMPT + first + FOLLOW_UP
        want, done = turn(endpoint, history, "den")
        assert done.usage["cached_tokens"] >= len(PROMPT)
    finally:
        stop(proc)
    # interrupted: turn 1, the daemon stops, a new one (new worker, new KV store) hydrates from disk
    proc, endpoint = start_daemon(tmp_path / "b", *extra)
    sock_dir = Path(endpoint[len("ipc://") :]).parent
    try:
        assert turn(endpoint, PROMPT, "den")[0] == first
        entries = wait_for_entries(sock_dir, 1)
        assert entries[0]["id"].startswith("c-den.") and entries[0]["tokens"] >= len(PROMPT)
    finally:
        stop(proc)
    proc, endpoint = start_daemon(tmp_path / "b", *extra)
    try:
        got, done = turn(endpoint, history, "den")
        assert got == want
        assert done.usage["cached_tokens"] == entries[0]["tokens"]
        status = json.loads(ctl(sock_dir, "--json", "status").stdout)
        assert status["kv"]["hits"] == 1 and status["kv"]["hydrated_tokens"] == entries[0]["tokens"]
        # without the id, the prompt alone finds it (Home Assistant sends no id)
        got2, done2 = turn(endpoint, history, None)
        assert got2 == want
    finally:
        stop(proc)


def test_genie_ctl_kv_ls_evict_clear(tmp_path):
    proc, endpoint = start_daemon(tmp_path)
    sock_dir = Path(endpoint[len("ipc://") :]).parent
    try:
        turn(endpoint, PROMPT, "hall")
        turn(endpoint, [2] + PROMPT[1:], None)
        entries = wait_for_entries(sock_dir, 2)
        assert {e["id"][:2] for e in entries} == {"c-", "t-"}
        table = ctl(sock_dir, "kv", "ls")
        hall = next(e["id"] for e in entries if e["conv_id"] == "hall")
        assert table.returncode == 0 and hall in table.stdout
        assert ctl(sock_dir, "kv", "evict", hall).returncode == 0
        assert ctl(sock_dir, "kv", "evict", hall).returncode == 1  # no longer there
        bad = ctl(sock_dir, "kv", "evict", "../../etc/passwd")
        assert bad.returncode == 1 and "not an entry id" in bad.stderr
        cleared = json.loads(ctl(sock_dir, "--json", "kv", "clear").stdout)
        assert cleared == {"cleared": 1}
        assert "no saved conversations" in ctl(sock_dir, "kv", "ls").stdout
    finally:
        stop(proc)


def test_killed_kv_store_is_restarted_and_turns_go_on(tmp_path):
    proc, endpoint = start_daemon(tmp_path)
    sock_dir = Path(endpoint[len("ipc://") :]).parent
    try:
        pid = json.loads(ctl(sock_dir, "--json", "status").stdout)["kv_store_pid"]
        os.kill(pid, signal.SIGKILL)
        first, _ = turn(endpoint, PROMPT, "porch")  # served meanwhile (its save waits in the worker)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            status = json.loads(ctl(sock_dir, "--json", "status").stdout)
            if status["kv_store_pid"] != pid and status["kv"].get("restarts") == 1 and "hits" in status["kv"]:
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"the KV store was not restarted: {status}")
        # saving works again once the worker's socket has reconnected to the new store (zmq retries every
        # 100 ms; a save made before that is kept and handed over then): a turn or two later at most
        for _ in range(5):
            turn(endpoint, PROMPT, "porch")
            try:
                assert wait_for_entries(sock_dir, 1, timeout_s=2)[0]["id"].startswith("c-porch.")
                break
            except AssertionError:
                continue
        else:
            raise AssertionError("no turn was saved after the KV store's restart")
    finally:
        stop(proc)


@pytest.mark.parametrize("n_layers", [28, 36])  # Qwen3-0.6B's and Qwen3-4B's layer counts (Gemma 3's 18: test_path_f)
@pytest.mark.parametrize("kv", ["int8", "fp16"])
def test_many_layers_are_saved_and_hydrated_through_the_daemon(tmp_path, n_layers, kv):
    """INT8 KV of more than 16 layers once exceeded the codec's side-frame limit: no model of real depth
    saved or hydrated anything, silently (issue 21 item 1)."""
    from testkit.tiny_models import write_tiny_model

    model = tmp_path / f"deep-{n_layers}.gguf"
    write_tiny_model("qwen3", model, n_layers=n_layers)
    extra = ("--fp16-kv",) if kv == "fp16" else ()
    proc, endpoint = start_daemon(tmp_path, *extra, model=str(model))
    sock_dir = Path(endpoint[len("ipc://") :]).parent
    try:
        first, _ = turn(endpoint, PROMPT, "deep")
        assert wait_for_entries(sock_dir, 1)[0]["tokens"] >= len(PROMPT)
    finally:
        stop(proc)
    proc, endpoint = start_daemon(tmp_path, *extra, model=str(model))
    try:
        _, done = turn(endpoint, PROMPT + first + FOLLOW_UP, "deep")
        assert done.usage["cached_tokens"] >= len(PROMPT)
    finally:
        stop(proc)


def can_mount_a_small_disk() -> bool:
    """Whether this machine lets an unprivileged user mount a tmpfs in a user namespace of its own."""
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=4k tmpfs /mnt"], capture_output=True, timeout=30
    )
    return probe.returncode == 0


def on_a_small_disk(directory: Path, size_bytes: int) -> tuple[str, ...]:
    """A command prefix that runs the daemon (and its children) with `directory` a tmpfs of `size_bytes`,
    mounted in a user namespace of its own: a disk that really fills up, with no root."""
    directory.mkdir(exist_ok=True)
    mount = f'mount -t tmpfs -o size={size_bytes},mode=0700 tmpfs "$0" && exec "$@"'
    return ("unshare", "-rm", "sh", "-c", mount, str(directory))


def kv_status(sock_dir: Path) -> dict:
    return json.loads(ctl(sock_dir, "--json", "status").stdout)["kv"]


def wait_for_kv(sock_dir: Path, done, timeout_s: float = 10) -> dict:
    """STATUS's `kv` once `done(kv)` holds (the saves go on after DONE, on the worker's saver thread)."""
    deadline = time.monotonic() + timeout_s
    kv = kv_status(sock_dir)
    while not done(kv) and time.monotonic() < deadline:
        time.sleep(0.1)
        kv = kv_status(sock_dir)
    return kv


@pytest.mark.skipif(not can_mount_a_small_disk(), reason="needs unshare -rm (unprivileged user namespaces)")
def test_a_real_disk_full_below_the_cap_evicts_and_counts_what_still_fails(tmp_path):
    """Item 7 on a real full disk: a 64 KiB tmpfs (two of these turns' entries, 6 pages each) under the default
    1 GiB cap. The third conversation's save meets ENOSPC: the least recently used entry is evicted and the
    save written. A turn whose entry is larger than the whole disk fails, and STATUS and METRICS say so."""
    wrap = on_a_small_disk(tmp_path / "kv", 64 << 10)
    proc, endpoint = start_daemon(tmp_path, "--parallel", "1", wrap=wrap)
    sock_dir = Path(endpoint[len("ipc://") :]).parent
    try:
        for i, conv in enumerate(("a", "b", "c")):
            turn(endpoint, [1] + [3 + (7 * j + i) % 290 for j in range(120)], conv)
            kv = wait_for_kv(sock_dir, lambda kv, n=i + 1: kv["saves"] + kv.get("save_failures", 0) >= n)
        assert (kv["saves"], kv.get("save_failures"), kv["evictions"]) == (3, 0, 1), kv
        assert sorted(e["conv_id"] for e in wait_for_entries(sock_dir, 2)) == ["b", "c"]  # a was the oldest
        turn(endpoint, [1] + [3 + (5 * j) % 290 for j in range(400)], "long")  # ~67 KB of KV: never fits
        kv = wait_for_kv(sock_dir, lambda kv: kv["save_failures"] >= 1)
        assert kv["save_failures"] == 1 and "No space left on device" in (kv["last_error"] or ""), kv
        counters = json.loads(ctl(sock_dir, "--json", "metrics").stdout)
        assert counters["genie_kv_store_save_failures"] == 1 and counters["genie_kv_store_saves"] == 3
        turn(endpoint, [1] + [3 + (11 * j) % 290 for j in range(120)], "d")  # the store goes on saving
        assert wait_for_kv(sock_dir, lambda kv: kv["saves"] >= 4)["saves"] == 4
    finally:
        stop(proc)


def test_a_cache_directory_deleted_at_run_time_is_made_again_at_the_next_save(tmp_path):
    """Item 8: with the directory removed while the daemon ran, every lookup and save failed until a restart.
    Now `kv ls` and STATUS answer (nothing saved), the next save makes the directory again (0700), and the
    turn after hydrates from it."""
    proc, endpoint = start_daemon(tmp_path, "--parallel", "1")  # one slot: a turn between gives it away
    sock_dir = Path(endpoint[len("ipc://") :]).parent
    try:
        turn(endpoint, PROMPT, "den")
        wait_for_entries(sock_dir, 1)
        shutil.rmtree(tmp_path / "kv")
        listed = ctl(sock_dir, "kv", "ls")
        assert listed.returncode == 0 and "no saved conversations" in listed.stdout, listed.stdout + listed.stderr
        assert kv_status(sock_dir)["entries"] == 0
        hall = [1] + [5 + (3 * i) % 280 for i in range(100)]
        answer, _ = turn(endpoint, hall, "hall")
        (entry,) = wait_for_entries(sock_dir, 1)
        assert entry["conv_id"] == "hall" and stat.S_IMODE((tmp_path / "kv").stat().st_mode) == 0o700
        turn(endpoint, PROMPT, "den")  # takes the slot: "hall" comes back from the store
        _, done = turn(endpoint, hall + answer + FOLLOW_UP, "hall")
        assert done.usage["cached_tokens"] == entry["tokens"]
    finally:
        stop(proc)


def test_a_directory_planted_at_a_conversations_entry_blocks_none_of_its_saves(tmp_path):
    """Item 10 through the daemon: a directory where `den`'s entry belongs cost each of its turns an ERROR line
    and its save. Now the entry is saved beside it, and the next turn hydrates from there."""
    proc, endpoint = start_daemon(tmp_path, "--parallel", "1")
    sock_dir = Path(endpoint[len("ipc://") :]).parent
    try:
        turn(endpoint, PROMPT, "probe")  # its entry's id carries the tag of this model and KV layout
        tag = wait_for_entries(sock_dir, 1)[0]["id"].rsplit(".", 1)[1]
        planted = tmp_path / "kv" / f"c-den.{tag}.kv"
        planted.mkdir()
        den = [1] + [4 + (5 * i) % 280 for i in range(100)]
        answer, _ = turn(endpoint, den, "den")
        saved = next(e for e in wait_for_entries(sock_dir, 2) if e["conv_id"] == "den")
        assert saved["id"] == f"c-den.{tag}-1", saved
        turn(endpoint, PROMPT, "probe")  # takes the one slot: "den" comes back from the store
        _, done = turn(endpoint, den + answer + FOLLOW_UP, "den")
        assert done.usage["cached_tokens"] == saved["tokens"] and planted.is_dir()
    finally:
        log = stop_and_log(proc)
    assert "kv_save_failed" not in log and "kv_io_error" not in log, log[-3000:]
    assert log.count(f"kv_left_alone file={planted.name!r}") == 1, log[-3000:]


def stop_and_log(proc) -> str:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0
    return err


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_saves_made_while_the_store_is_down_are_counted_and_handed_to_it_once_restarted(tmp_path):
    """Item 9: with the KV store killed between turns, the saves of the turns until its restart were dropped
    (24 kills, 24 `kv_save_dropped` log lines, counted nowhere) and the next turns hydrated a shorter prefix.
    Now the worker keeps them (bounded), hands them to the restarted store, and counts both; STATUS's
    `kv.worker_saves`, METRICS and /metrics show the counts."""
    config = tmp_path / "genie.toml"
    config.write_text("restart_backoff_s = 4.0\n")  # the store stays down longer than a save waits for it (2 s)
    port = free_port()
    proc, endpoint = start_daemon(tmp_path, "--parallel", "1", "--config", str(config), "--http-port", str(port))
    sock_dir = Path(endpoint[len("ipc://") :]).parent
    try:
        first, _ = turn(endpoint, PROMPT, "den")
        assert wait_for_entries(sock_dir, 1)[0]["tokens"] == len(PROMPT) + len(first) - 1  # (the last token's KV
        # is written by the next turn's prefill)
        killed = json.loads(ctl(sock_dir, "--json", "status").stdout)["kv_store_pid"]
        os.kill(killed, signal.SIGKILL)
        history = PROMPT + first + FOLLOW_UP
        second, _ = turn(endpoint, history, "den")  # ends while the store is down
        turn(endpoint, [1] + [4 + (5 * i) % 280 for i in range(80)], "hall")  # so does this; it takes the one slot
        kept = len(history) + len(second) - 1

        def den_saved() -> int:
            r = ctl(sock_dir, "--json", "kv", "ls")
            entries = json.loads(r.stdout)["entries"] if r.returncode == 0 else []
            return max([e["tokens"] for e in entries if e["conv_id"] == "den"], default=0)

        deadline = time.monotonic() + 20  # the restart's 4 s, the store's start, the hand-over
        while den_saved() != kept and time.monotonic() < deadline:
            time.sleep(0.2)
        kv = wait_for_kv(sock_dir, lambda kv: (kv.get("worker_saves") or {}).get("acked") == 3)  # (a beat later)
        _, done = turn(endpoint, history + second + FOLLOW_UP, "den")  # hydrated from the store: the slot is hall's
        assert (kv.get("worker_saves"), done.usage["cached_tokens"]) == (
            {"acked": 3, "kept": 2, "handed_over": 2, "dropped": 0, "held": 0, "held_bytes": 0},
            kept,
        ), kv
        assert kv["pid"] != killed and kv["restarts"] == 1
        counters = json.loads(ctl(sock_dir, "--json", "metrics").stdout)
        assert counters["genie_kv_worker_saves_kept"] == 2 and counters["genie_kv_worker_saves_handed_over"] == 2
        assert counters["genie_kv_worker_saves_dropped"] == 0
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
        assert "genie_kv_worker_saves_kept 2.0" in text and "genie_kv_worker_saves_dropped 0.0" in text, text
    finally:
        stop(proc)


def test_a_save_kept_when_the_daemon_stops_reaches_the_store_started_for_it(tmp_path):
    """Item 9 at shutdown: a turn that ended while the store waited out its restart backoff is kept by the
    worker; stopping the daemon then (SIGTERM, `genie-ctl stop`) dropped it (`kv_save_dropped: the worker
    stopped before the KV store took it`) and the next start hydrated the turn before. The daemon now starts
    the store at once when it stops, so what the worker kept is written before it exits."""
    config = tmp_path / "genie.toml"
    config.write_text("restart_backoff_s = 60.0\n")  # the store stays down until the daemon stops
    proc, endpoint = start_daemon(tmp_path, "--parallel", "1", "--config", str(config))
    sock_dir = Path(endpoint[len("ipc://") :]).parent
    try:
        first, _ = turn(endpoint, PROMPT, "den")
        wait_for_entries(sock_dir, 1)
        os.kill(json.loads(ctl(sock_dir, "--json", "status").stdout)["kv_store_pid"], signal.SIGKILL)
        history = PROMPT + first + FOLLOW_UP
        second, _ = turn(endpoint, history, "den")
        kept = len(history) + len(second) - 1
        kv = wait_for_kv(sock_dir, lambda kv: (kv.get("worker_saves") or {}).get("held") == 1)
        assert kv["worker_saves"]["held"] == 1, kv
    finally:
        log_text = stop_and_log(proc)
    assert "kv_save_dropped" not in log_text and "kv_save_handed_over" in log_text, log_text[-3000:]
    proc, endpoint = start_daemon(tmp_path)
    try:
        entries = wait_for_entries(sock_dir, 1)
        assert [(e["conv_id"], e["tokens"]) for e in entries] == [("den", kept)]
    finally:
        stop(proc)
