"""Admin LOAD through the real daemon (issue 34 item 3): a name that names nothing loadable is an error
reply and the served model stays, worker and all; 1 200 fuzzed admin frames restart nothing."""

from __future__ import annotations

import json
import random
from pathlib import Path

import msgpack
import pytest
import zmq

from genie_protocol.codec import decode, encode
from genie_protocol.messages import Error, Load, Message, Reply, Status
from testkit.tiny_models import write_tiny_model
from tests.genie_daemon.test_daemon import ctl, start_daemon


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("admin")
    proc, endpoint = start_daemon(tmp)
    sock_dir = Path(endpoint[len("ipc://") :]).parent
    yield tmp, sock_dir
    proc.terminate()
    try:
        proc.communicate(timeout=30)
    finally:
        proc.kill()


def admin_call(sock_dir: Path, msg: Message | bytes) -> Message | None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(f"ipc://{sock_dir}/admin.sock")
    try:
        sock.send_multipart(encode(msg) if isinstance(msg, Message) else [msg])
        if not sock.poll(5000):
            return None
        return decode(sock.recv_multipart())[0]
    finally:
        sock.close()
        ctx.term()


def status(sock_dir: Path) -> dict:
    reply = admin_call(sock_dir, Status(request_id="s"))
    assert isinstance(reply, Reply)
    return reply.data


@pytest.mark.parametrize(
    "model, says",
    [
        ("", "LOAD needs a model"),
        ("   ", "LOAD needs a model"),
        ("/etc/passwd", "not a GGUF file"),
        ("/", "not a regular file"),
        (".", "not a regular file"),
        ("/no/such/file.gguf", "no such file"),
        ("no-such-model", "no model 'no-such-model'"),
        ("qwen3-4b", "not pulled yet: genie-ctl pull qwen3-4b"),  # a catalogue name, auto_pull off
        ("hf://a/b/c.gguf", "not pulled yet"),
    ],
)
def test_a_bad_load_is_an_error_reply_and_the_served_model_stays(served, model, says):
    _, sock_dir = served
    before = status(sock_dir)
    reply = admin_call(sock_dir, Load(request_id="l", model=model))
    assert isinstance(reply, Error) and reply.code == "bad_model" and says in reply.message, reply
    after = status(sock_dir)
    assert after["ready"] and after["worker_pid"] == before["worker_pid"] and after["load_error"] is None
    assert after["worker_restarts"] == before["worker_restarts"] and after["model"] == before["model"]


def test_a_truncated_file_is_refused_before_the_worker_restarts(served):
    tmp, sock_dir = served
    cut = tmp / "cut.gguf"
    cut.write_bytes((tmp / "tiny.gguf").read_bytes()[:5000])
    before = status(sock_dir)
    reply = admin_call(sock_dir, Load(request_id="l", model=str(cut)))
    assert isinstance(reply, Error) and reply.code == "bad_model", reply
    assert status(sock_dir)["worker_pid"] == before["worker_pid"]


def test_loading_the_served_model_again_restarts_nothing(served):
    tmp, sock_dir = served
    before = status(sock_dir)
    reply = admin_call(sock_dir, Load(request_id="l", model=before["loaded_model"]))
    assert isinstance(reply, Reply), reply
    after = status(sock_dir)
    assert after["ready"] and after["worker_pid"] == before["worker_pid"]


def test_fuzzed_admin_frames_restart_nothing(served):
    tmp, sock_dir = served
    before = status(sock_dir)
    rng = random.Random(34)
    names = ["", ".", "..", "/", "/etc/passwd", "/dev/zero", "/proc/self/mem", str(tmp), "x" * 4096, "qwen3-4b"]
    for i in range(1200):
        kind = i % 4
        if kind == 0:
            model = rng.choice(names)
        elif kind == 1:
            model = "".join(chr(rng.randrange(32, 0x2FF)) for _ in range(rng.randrange(1, 40)))
        elif kind == 2:
            model = str(tmp / rng.choice(["", "kv", "run", "tiny.gguf.x", "run/admin.sock"]))
        else:
            model = rng.randbytes(rng.randrange(1, 30)).decode("latin-1")
        frame = bytes((Load.TYPE,)) + msgpack.packb({"request_id": f"f{i}", "model": model})
        reply = admin_call(sock_dir, frame)
        assert isinstance(reply, Error), (model, reply)  # none of them names a model: all refused, all answered
    after = status(sock_dir)
    assert after["ready"] and after["worker_pid"] == before["worker_pid"], after
    assert after["worker_restarts"] == before["worker_restarts"] and after["load_error"] is None
    assert ctl(sock_dir, "generate", "-n", "2", "hi").returncode == 0


def test_a_good_load_still_switches(served, tmp_path):
    tmp, sock_dir = served
    other = tmp / "other.gguf"
    write_tiny_model("qwen3", other)
    r = ctl(sock_dir, "--json", "load", str(other))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["model"] == status(sock_dir)["model"] and status(sock_dir)["ready"]
