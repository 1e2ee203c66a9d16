"""Models like Ollama's, against a real daemon (tiny qwen3 served from a path) and real clients: the
`ollama` library pulls a tiny GGUF from a local HTTP server into the daemon's models directory, lists it,
chats with it (which loads it in place of the served one), and deletes it; a file that is no GGUF is
refused and never listed; `genie-ctl pull` and `genie-ctl load` do the same through the admin socket; a
client that leaves mid-pull stops the download; a daemon with `auto_pull` fetches its model at start.

The daemon runs with XDG_DATA_HOME and GENIE_MODELS_DIR pointing elsewhere than its --models-dir, so a
model found at all was found where the daemon's config says (the worker gets --models-dir)."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import ollama
import openai
import pytest

from testkit.tiny_models import write_tiny_model
from tests.child_env import ROOT, child_env
from tests.genie_common.models.file_server import FileServer, serving
from tests.genie_daemon.test_http_live import free_port, get_json

START_TIMEOUT_S = 60
HI = [{"role": "user", "content": "hi"}]
SHORT = {"num_predict": 3, "ignore_eos": True}


@dataclass
class Live:
    url: str
    sock_dir: Path
    models_dir: Path
    files: FileServer
    tiny2: bytes  # the GGUF the file server has at /tiny2.gguf
    proc: subprocess.Popen[str]


def start_daemon(tmp: Path, model: str, models_dir: Path, **env: str) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    cmd = [sys.executable, "-m", "genie_daemon", "-m", model, "--models-dir", str(models_dir)]
    cmd += ["--socket-dir", str(tmp / "run"), "--kv-cache-dir", str(tmp / "kv"), "--http-port", str(port)]
    # the default models directory is elsewhere: only --models-dir can find what the daemon pulls
    env = {"XDG_DATA_HOME": str(tmp / "xdg"), "GENIE_MODELS_DIR": str(tmp / "not-this-one"), **env}
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=child_env(no_proxy="127.0.0.1", **env), stderr=subprocess.PIPE, text=True
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            if get_json(url + "/health")[0] == 200:
                return proc, url
        except OSError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"daemon not ready: {proc.communicate()[1]}")


def stop_daemon(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.communicate(timeout=30)
    finally:
        proc.kill()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    tmp = tmp_path_factory.mktemp("models-live")
    served = tmp / "tiny.gguf"
    write_tiny_model("qwen3", served)
    pulled = tmp / "src" / "tiny2.gguf"
    pulled.parent.mkdir()
    write_tiny_model("llama", pulled, seed=3)
    tiny2 = pulled.read_bytes()
    files = FileServer({"/tiny2.gguf": tiny2, "/tiny3.gguf": tiny2, "/junk.gguf": random.Random(5).randbytes(70_000)})
    with serving(files):
        proc, url = start_daemon(tmp, str(served), tmp / "models")
        yield Live(url, tmp / "run", tmp / "models", files, pulled.read_bytes(), proc)
        stop_daemon(proc)


def ctl(live: Live, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "genie_daemon.ctl", "--socket-dir", str(live.sock_dir), *args],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_pull_list_chat_switch_and_delete_through_the_ollama_client(live):
    with ollama.Client(host=live.url) as client:
        lines = list(client.pull(f"{live.files.url}/tiny2.gguf", stream=True))
        statuses = [ln.status for ln in lines]
        steps = ["pulling manifest", "downloading", "verifying sha256 digest", "writing manifest", "success"]
        assert [s for i, s in enumerate(statuses) if s not in statuses[:i]] == steps, statuses
        last_download = [ln for ln in lines if ln.status == "downloading"][-1]
        assert last_download.completed == last_download.total == len(live.tiny2)

        listed = {m.model: m for m in client.list().models}
        assert list(listed)[0] == "tiny" and "tiny2" in listed  # the served model first
        tiny2 = listed["tiny2"]
        assert tiny2.digest == hashlib.sha256(live.tiny2).hexdigest() and tiny2.size == len(live.tiny2)
        assert tiny2.details.family == "llama" and tiny2.details.quantization_level == "F32"
        assert tiny2.details.parameter_size and client.show("tiny2").details.family == "llama"
        with openai.OpenAI(base_url=live.url + "/v1", api_key="x", max_retries=0) as oa:
            assert [m.id for m in oa.models.list().data] == list(listed)

        r = client.chat(model="tiny2", messages=HI, options=SHORT)  # loads it in place of tiny
        assert r.model == "tiny2" and r.eval_count == 3 and r.load_duration > 0
        status = json.loads(ctl(live, "--json", "status").stdout)
        assert status["loaded_model"] == "tiny2" and status["model"] == "tiny-llama" and status["ready"]
        assert [m.model for m in client.ps().models] == ["tiny2"]
        with pytest.raises(ollama.ResponseError) as e:
            client.delete("tiny2")  # served: refused, so a worker restart still finds it
        assert e.value.status_code == 409

        r = client.chat(model="tiny", messages=HI, options=SHORT)  # and back
        assert r.model == "tiny" and json.loads(ctl(live, "--json", "status").stdout)["model"] == "tiny-qwen3"
        assert client.delete("tiny2").status == "success"
        assert "tiny2" not in [m.model for m in client.list().models]
        assert not (live.models_dir / "tiny2.gguf").exists()
        with pytest.raises(ollama.ResponseError) as e:
            client.chat(model="tiny2", messages=HI, options=SHORT)
        assert e.value.status_code == 404


def test_requests_for_two_models_at_once_each_run_on_their_own(live):
    """Requests naming the served model and a pulled one, sent together, queue up and switch the daemon
    back and forth; each answer is the one its own model gives alone (greedy), never the other's."""
    prompt, opts = "ab cd", {"num_predict": 8, "ignore_eos": True, "temperature": 0}
    with ollama.Client(host=live.url) as client:
        list(client.pull(f"{live.files.url}/tiny2.gguf", stream=True))
        alone = {m: client.generate(model=m, prompt=prompt, raw=True, options=opts).response for m in ("tiny2", "tiny")}
    assert alone["tiny"] != alone["tiny2"]
    order = ["tiny2", "tiny", "tiny2", "tiny", "tiny", "tiny2"]
    answers: dict[int, tuple[str, str]] = {}

    def ask(i: int, model: str) -> None:
        with ollama.Client(host=live.url) as c:
            r = c.generate(model=model, prompt=prompt, raw=True, options=opts)
            answers[i] = (r.model, r.response)

    threads = [threading.Thread(target=ask, args=(i, m)) for i, m in enumerate(order)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert answers == {i: (m, alone[m]) for i, m in enumerate(order)}
    with ollama.Client(host=live.url) as client:
        client.chat(model="tiny", messages=HI, options=SHORT)  # the served one again: tiny2 may go
        assert client.delete("tiny2").status == "success"


def test_a_file_that_is_no_gguf_is_refused_and_never_listed(live):
    with ollama.Client(host=live.url) as client:
        with pytest.raises(ollama.ResponseError) as e:
            list(client.pull(f"{live.files.url}/junk.gguf", stream=True))
        assert "GGUF" in str(e.value) or "magic" in str(e.value), str(e.value)
        with pytest.raises(ollama.ResponseError) as e:
            client.pull(f"{live.files.url}/junk.gguf", stream=False)
        assert e.value.status_code == 400
        assert "junk" not in [m.model for m in client.list().models]
    left = [p.name for p in live.models_dir.iterdir() if p.name.startswith(("junk", ".junk"))]
    assert not [n for n in left if n.endswith((".gguf", ".json", ".part"))], left  # the pull's lock may stay


def test_genie_ctl_pull_and_load_a_pulled_model(live):
    r = ctl(live, "pull", f"{live.files.url}/tiny3.gguf")
    assert r.returncode == 0 and r.stdout.startswith("tiny3:"), r.stderr
    assert "verifying sha256 digest" in r.stderr  # progress on stderr, a line a step (no terminal)
    with ollama.Client(host=live.url) as client:
        assert "tiny3" in [m.model for m in client.list().models]
    r = ctl(live, "--json", "load", "tiny3")
    assert r.returncode == 0 and json.loads(r.stdout)["loaded_model"] == "tiny3", r.stderr
    with ollama.Client(host=live.url) as client:
        assert client.chat(model="tiny3", messages=HI, options=SHORT).eval_count == 3
        assert client.chat(model="tiny", messages=HI, options=SHORT).model == "tiny"
        assert client.delete("tiny3").status == "success"
    bad = ctl(live, "pull", f"{live.files.url}/junk.gguf")
    assert bad.returncode == 1 and "pull_failed" in bad.stderr


class SlowFile:
    """Serves /NAME.gguf a chunk at a time, slowly, and notes when the reader hung up. The whole file would take
    about five minutes, so a test that stops the download is done long before the end even on a loaded machine."""

    CHUNK = 4096
    SIZE = 1 << 26

    def __init__(self, name: str) -> None:
        self.name = name
        self.hung_up = threading.Event()
        self.sent = 0

    @contextmanager
    def serving(self) -> Iterator[str]:
        slow = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Length", str(slow.SIZE))
                self.end_headers()
                try:
                    for _ in range(slow.SIZE // slow.CHUNK):  # each request its own count
                        self.wfile.write(b"\0" * slow.CHUNK)
                        self.wfile.flush()
                        slow.sent += slow.CHUNK
                        time.sleep(0.02)
                except OSError:
                    slow.hung_up.set()

        httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        thread = threading.Thread(target=httpd.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{httpd.server_address[1]}/{self.name}.gguf"
        finally:
            httpd.shutdown()
            httpd.server_close()
            thread.join()


def test_a_client_that_leaves_mid_pull_stops_the_download(live):
    """The HTTP client goes away after the first progress: the daemon stops reading the file (the server
    sees the connection closed long before the end) and keeps the part for a later pull to resume."""
    slow = SlowFile("slow")
    with slow.serving() as source:
        body = json.dumps({"model": source}).encode()
        r = urllib.request.urlopen(urllib.request.Request(live.url + "/api/pull", data=body), timeout=30)
        while json.loads(r.readline())["status"] != "downloading":
            pass
        r.close()
        assert slow.hung_up.wait(20), f"the download went on: {slow.sent} bytes sent"
        assert slow.sent < slow.SIZE
    assert (live.models_dir / ".slow.part").exists()
    with ollama.Client(host=live.url) as client:
        assert "slow" not in [m.model for m in client.list().models]


def test_genie_ctl_pull_cancelled_by_ctrl_c(live):
    """Ctrl-C in `genie-ctl pull` sends CANCEL: the daemon stops the download, genie-ctl exits 130."""
    slow = SlowFile("slow-ctl")
    with slow.serving() as source:
        cmd = [sys.executable, "-m", "genie_daemon.ctl", "--socket-dir", str(live.sock_dir), "pull", source]
        proc = subprocess.Popen(cmd, cwd=ROOT, env=child_env(), stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        for line in proc.stderr:  # a line a step: not a terminal
            if "downloading" in line:
                break
        else:
            raise AssertionError(f"genie-ctl ended before the download: {proc.wait()}")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130 and "cancelled" in err and "Traceback" not in err, err
        assert slow.hung_up.wait(20), f"the download went on: {slow.sent} bytes sent"
    with ollama.Client(host=live.url) as client:
        assert "slow-ctl" not in [m.model for m in client.list().models]


def test_auto_pull_fetches_the_configured_model_at_start(live, tmp_path):
    """The add-on's way: `model` names a source that is not here and auto_pull is on; the daemon pulls it
    into its models directory, then serves it under its name there."""
    models_dir = tmp_path / "models"
    proc, url = start_daemon(tmp_path, f"{live.files.url}/tiny2.gguf", models_dir, GENIE_AUTO_PULL="true")
    try:
        with ollama.Client(host=url) as client:
            assert [m.model for m in client.list().models] == ["tiny2"]
            assert client.chat(model="tiny2", messages=HI, options=SHORT).eval_count == 3
        assert (models_dir / "tiny2.gguf").read_bytes() == live.tiny2
    finally:
        stop_daemon(proc)


def test_auto_pull_failure_is_a_load_error(live, tmp_path):
    """A configured model that cannot be pulled: /health says load_failed with the reason, at once."""
    port = free_port()
    cmd = [sys.executable, "-m", "genie_daemon", "-m", f"{live.files.url}/junk.gguf"]
    cmd += ["--models-dir", str(tmp_path / "models"), "--socket-dir", str(tmp_path / "run")]
    cmd += ["--kv-cache-dir", str(tmp_path / "kv"), "--http-port", str(port)]
    env = child_env(no_proxy="127.0.0.1", GENIE_AUTO_PULL="1", GENIE_MODELS_DIR=str(tmp_path / "not-this-one"))
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        health: Any = None
        while time.monotonic() < deadline:
            try:
                health = get_json(f"http://127.0.0.1:{port}/health")
            except OSError:
                time.sleep(0.05)
                continue
            if health[1]["status"] == "load_failed":
                break
            time.sleep(0.05)
        assert health is not None and health[0] == 503 and health[1]["status"] == "load_failed", health
        status = subprocess.run(
            [sys.executable, "-m", "genie_daemon.ctl", "--socket-dir", str(tmp_path / "run"), "--json", "status"],
            cwd=ROOT,
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "pulling" in json.loads(status.stdout)["load_error"]
    finally:
        stop_daemon(proc)
    assert not [p for p in os.listdir(tmp_path / "models") if p.endswith((".gguf", ".json"))]
