"""The worker's KV link when the KV store is absent: lookups return without waiting for their timeout (a
fresh link waits at most STARTUP_WAIT_S once for a store starting beside it) and saves are kept for it
(once OUTBOX_S old; the newest KEEP_SAVES, counted) or dropped with a count (at once beyond SAVE_BACKLOG), so
a turn never stalls or fails for the store's sake, and what was kept reaches the store once it is there; a
store that binds after the worker connected still answers the first lookup; and more saves at once than the
socket queues all arrive."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import zmq

from genie_common.engine_options import EngineOptions
from genie_kvstore.server import KVStoreServer, ServerConfig
from genie_kvstore.store import StoreConfig
from genie_workers.engine.engine import Engine
from genie_workers.engine.sampling import SamplingParams
from genie_workers.kv_link import KEEP_SAVES, OUTBOX_S, SAVE_BACKLOG, SAVE_QUEUE, STARTUP_WAIT_S, KvLink
from testkit.tiny_models import write_tiny_model


@pytest.mark.timeout(60)  # with a queueing socket the lookup would wait its 600 s timeout: this fails it
def test_absent_store_costs_nothing(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_model("llama", path)
    engine = Engine(EngineOptions(model=str(path), backend="numpy", ctx=256, parallel=1), kv_dtype="f32")
    ctx = zmq.Context()
    link = KvLink(ctx, f"ipc://{tmp_path}/no-store.sock", engine, timeout_s=600)
    try:
        prompt = [1] + [3 + i % 200 for i in range(100)]
        t0 = time.monotonic()
        assert link.hydrate(prompt, "den") == 0
        assert time.monotonic() - t0 < STARTUP_WAIT_S + 5  # the startup grace, never the 600 s timeout
        for _ in engine.generate(prompt, SamplingParams(temperature=0, max_tokens=4)):
            pass
        t0 = time.monotonic()
        assert all(link.save("den") for _ in range(SAVE_BACKLOG))  # queued: the saver waits for a store
        assert time.monotonic() - t0 < 1.0  # the engine thread never waits for the store
        assert link.save("den") is False and link.counts.dropped == 1  # the backlog is full: dropped at once
        assert link.flush(timeout_s=OUTBOX_S + 10)  # the first waits OUTBOX_S, the others are kept behind it at once
        c = link.counts_now()
        assert (c.kept, c.held, c.dropped) == (SAVE_BACKLOG, 1, 1)  # each newer save of "den" covers the older
        assert link.hydrate(prompt + [7, 8], "den") == 0
    finally:
        link.close()
        ctx.term()


def serve_in_thread(config: ServerConfig, delay_s: float = 0.0) -> tuple[threading.Thread, list]:
    """A KV-store server on a thread, started after `delay_s`; holder[0] is the server once it runs."""
    holder: list = []

    def run() -> None:
        time.sleep(delay_s)
        server = KVStoreServer(config)
        holder.append(server)
        server.serve()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, holder


def stop_server(thread: threading.Thread, holder: list) -> None:
    while not holder:
        time.sleep(0.01)
    holder[0].stopping = True
    thread.join(10)


@pytest.mark.timeout(60)
def test_a_store_that_binds_after_a_fresh_worker_connected_answers_its_first_lookup(tmp_path):
    """A restart: the daemon starts the worker and the store at once, and the store may bind its socket after
    the worker's link connected; the first turn still hydrates what the last one saved."""
    path = tmp_path / "tiny.gguf"
    write_tiny_model("llama", path)
    engine = Engine(EngineOptions(model=str(path), backend="numpy", ctx=256, parallel=1))
    endpoint = f"ipc://{tmp_path}/kv.sock"
    config = ServerConfig(endpoint, StoreConfig(tmp_path / "kv", 64 << 20, 60.0))
    prompt = [1] + [3 + (i * 7) % 200 for i in range(150)]
    ctx = zmq.Context()
    servers = []
    links = []
    try:
        servers.append(serve_in_thread(config))
        first = KvLink(ctx, endpoint, engine)  # a fresh worker's link; the store binds on its own thread
        links.append(first)
        for _ in engine.generate(prompt, SamplingParams(temperature=0, max_tokens=4)):
            pass
        assert first.save("den") is True
        deadline = time.monotonic() + 10
        while first.counts.acked == 0 and time.monotonic() < deadline:
            time.sleep(0.02)  # the saver thread sends it once the store is there
        assert first.counts.acked == 1
        stop_server(*servers.pop())
        engine.kv.clear()
        fresh = KvLink(ctx, endpoint, engine)  # connects before the store is back
        links.append(fresh)
        servers.append(serve_in_thread(config, delay_s=0.3))
        n = fresh.hydrate(prompt + [9, 9], "den")
        assert n >= len(prompt)
        assert np.array_equal(np.asarray(engine.kv.held(0)[:n]), np.asarray((prompt + [9, 9])[:n]))
    finally:
        for link in links:
            link.close()
        for server in servers:
            stop_server(*server)
        ctx.term()


@pytest.mark.timeout(60)
def test_saves_beyond_the_socket_queue_wait_in_the_outbox_and_all_arrive(tmp_path):
    """Eight streams that end in one step start eight saves at once, more than the socket queues
    (SAVE_QUEUE): the others wait for the saver thread and leave as the store takes them; none is dropped,
    and each is what its slot held, sent in one frame."""
    path = tmp_path / "tiny.gguf"
    write_tiny_model("llama", path)
    n = 2 * SAVE_QUEUE
    engine = Engine(EngineOptions(model=str(path), backend="numpy", ctx=256, parallel=n))
    endpoint = f"ipc://{tmp_path}/kv.sock"
    server = serve_in_thread(ServerConfig(endpoint, StoreConfig(tmp_path / "kv", 64 << 20, 60.0)))
    ctx = zmq.Context()
    link = KvLink(ctx, endpoint, engine)
    try:
        params = SamplingParams(temperature=0, max_tokens=3)
        prompts = [[1] + [3 + (i * 7 + s) % 200 for i in range(80)] for s in range(n)]
        seqs = [engine.sequence(p, params) for p in prompts]
        for seq in seqs:
            engine.scheduler.submit(seq)
        while not engine.scheduler.idle:
            engine.step()
        held = [engine.export_kv(seq.slot) for seq in seqs]
        assert all(link.save(f"c{i}", seq.slot) for i, seq in enumerate(seqs))
        deadline = time.monotonic() + 20
        while (link.pending or link.counts.acked < n) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert (link.counts.acked, link.counts.dropped, link.counts.kept) == (n, 0, 0)
        for i, snap in enumerate(held):
            engine.kv.clear()
            got = link.hydrate([int(t) for t in snap.token_ids] + [5], f"c{i}", slot=0)
            assert got == snap.n_tokens
            back = engine.export_kv(0)
            assert all(np.array_equal(a, b) for a, b in zip(back.k + back.v, snap.k + snap.v, strict=True))
    finally:
        link.close()
        stop_server(*server)
        ctx.term()


def test_a_save_whose_rows_cannot_be_gathered_is_dropped_and_the_link_goes_on(tmp_path, monkeypatch):
    """No device memory for the gathered rows (say): that save is lost with a count, never the worker's
    engine thread, and the next save is taken."""
    path = tmp_path / "tiny.gguf"
    write_tiny_model("llama", path)
    engine = Engine(EngineOptions(model=str(path), backend="numpy", ctx=256, parallel=1))
    for _ in engine.generate([1] + [3 + i for i in range(70)], SamplingParams(temperature=0, max_tokens=2)):
        pass
    ctx = zmq.Context()
    link = KvLink(ctx, f"ipc://{tmp_path}/no-store.sock", engine)
    try:
        real = engine.start_export_kv

        def out_of_memory(*args, **kwargs):
            raise MemoryError("out of device memory")

        monkeypatch.setattr(engine, "start_export_kv", out_of_memory)
        assert link.save("den") is False and link.counts.dropped == 1 and not link.pending
        monkeypatch.setattr(engine, "start_export_kv", real)
        assert link.save("den") is True
    finally:
        link.close()
        ctx.term()


@pytest.mark.timeout(60)
def test_saves_the_store_does_not_take_are_kept_within_bounds_and_handed_to_it_when_it_comes(tmp_path):
    """Item 9: a store that is down (killed, restarting) took the turns' saves with it. The link keeps the
    newest KEEP_SAVES (the older ones are dropped, counted), then hands them to the store once it binds: each
    is written, and what became of every save is counted."""
    path = tmp_path / "tiny.gguf"
    write_tiny_model("llama", path)
    engine = Engine(EngineOptions(model=str(path), backend="numpy", ctx=256, parallel=1))
    for _ in engine.generate([1] + [3 + i % 200 for i in range(100)], SamplingParams(temperature=0, max_tokens=4)):
        pass
    endpoint = f"ipc://{tmp_path}/kv.sock"
    ctx = zmq.Context()
    link = KvLink(ctx, endpoint, engine)
    server = None
    try:
        n = KEEP_SAVES + 2
        for i in range(n):
            assert link.save(f"c{i}") is True
            assert link.flush(timeout_s=OUTBOX_S + 10)  # (the first waits OUTBOX_S; kept behind it, the rest at once)
        c = link.counts_now()
        assert (c.kept, c.held, c.dropped, c.handed_over, c.acked) == (n, KEEP_SAVES, 2, 0, 0), c
        assert c.held_bytes == KEEP_SAVES * engine.export_kv(0).n_tokens * 160  # 2 layers x 2 heads x (16+16+8)
        server = serve_in_thread(ServerConfig(endpoint, StoreConfig(tmp_path / "kv", 64 << 20, 60.0)))
        deadline = time.monotonic() + 20
        while link.counts_now().acked < KEEP_SAVES and time.monotonic() < deadline:
            time.sleep(0.02)
        c = link.counts_now()
        assert (c.handed_over, c.acked, c.held, c.held_bytes) == (KEEP_SAVES, KEEP_SAVES, 0, 0), c
        saved = sorted(p.name.split(".")[0] for p in (tmp_path / "kv").glob("*.kv"))
        assert saved == sorted(f"c-c{i}" for i in range(2, n))  # the newest KEEP_SAVES, each whole
    finally:
        link.close()
        if server:
            stop_server(*server)
        ctx.term()
