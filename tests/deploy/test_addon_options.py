"""The add-on's options -> genie.toml: what DaemonConfig accepts, and a clear error for each bad option."""

import json
import os
import subprocess
import sys
import tomllib
from dataclasses import fields
from pathlib import Path, PurePosixPath

import pytest
import yaml

from genie_common.config import DaemonConfig, load_config
from genie_daemon.addon_options import (
    DEFAULTS,
    KV_CACHE_DIR,
    MODELS_DIR,
    main,
    parse_options,
    render_toml,
    toml_string,
)

ADDON_CONFIG = Path(__file__).parents[2] / "deploy/homeassistant/config.yaml"
HTTP_KEYS = {"http", "http_host", "http_port", "api_key"}
FIELDS = {f.name for f in fields(DaemonConfig)}
needs_http_keys = pytest.mark.skipif(not HTTP_KEYS <= FIELDS, reason="http keys not in DaemonConfig yet")


@pytest.fixture(autouse=True)
def _no_genie_env(monkeypatch):
    for name in FIELDS:
        monkeypatch.delenv(f"GENIE_{name.upper()}", raising=False)


def _load(text: str, tmp_path: Path, drop: set[str] = frozenset()) -> DaemonConfig:
    kept = {k: v for k, v in tomllib.loads(text).items() if k not in drop}
    path = tmp_path / "genie.toml"
    path.write_text(text if not drop else "".join(f"{k} = {json.dumps(v)}\n" for k, v in kept.items()))
    return load_config(path)


def test_defaults_match_config_yaml():
    addon = yaml.safe_load(ADDON_CONFIG.read_text())
    assert addon["options"] == {k: v for k, v in DEFAULTS.items() if k not in ("api_key", "forward_url")}


EDGE_CASES = [
    {},  # what HA sends is never this thin, but every option has a default
    dict(yaml.safe_load(ADDON_CONFIG.read_text())["options"]),
    {"model": '/share/genie/Qwen3 0.6B "q4".gguf', "context": 256, "kv_cache_mb": 0, "fp16_kv": True},
    {"context": 131072, "api_key": 'k\\e"y=+/~', "forward_url": "not used in local mode"},
    {"mode": "local", "api_key": None, "forward_url": None},
    {"model": "qwen3-0.6b"},  # a catalogue model: pulled on first start
    {"model": "hf://Qwen/Qwen3-0.6B-GGUF/Qwen3-0.6B-Q8_0.gguf"},
    {"parallel": 3},  # three requests at once; 0 (the default) leaves the worker's own number
]


@pytest.mark.parametrize("options", EDGE_CASES)
def test_toml_keys_are_daemon_config_fields(options, tmp_path):
    text = render_toml(parse_options(options))
    values = tomllib.loads(text)
    assert set(values) <= FIELDS | HTTP_KEYS
    c = _load(text, tmp_path, drop=HTTP_KEYS - FIELDS)  # whatever DaemonConfig has today
    merged = DEFAULTS | {k: v for k, v in options.items() if v is not None}
    assert (c.model, c.ctx, c.fp16_kv, c.kv_cache_max_mb, c.parallel) == (
        merged["model"],
        merged["context"],
        merged["fp16_kv"],
        merged["kv_cache_mb"],
        merged["parallel"],
    )
    assert c.kv_cache_dir == KV_CACHE_DIR and PurePosixPath(c.kv_cache_dir).is_relative_to("/data")
    # a model that is not there yet is pulled at start, onto the persistent volume
    assert c.auto_pull and c.models_dir == MODELS_DIR and PurePosixPath(c.models_dir).is_relative_to("/data")


@needs_http_keys
@pytest.mark.parametrize("options", EDGE_CASES)
def test_load_config_accepts_the_whole_toml(options, tmp_path):
    c = _load(render_toml(parse_options(options)), tmp_path)
    assert (c.http, c.http_host, c.http_port) == (True, "0.0.0.0", 11434)
    assert c.api_key == (options.get("api_key") or "")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"mode": "remote"}, "mode must be 'local' or 'forward'"),
        ({"context": 100}, "context must be between 256 and 131072"),
        ({"context": "4096"}, "context must be an integer, not str"),
        ({"context": True}, "context must be an integer, not bool"),
        ({"kv_cache_mb": -1}, "kv_cache_mb must be >= 0"),
        ({"fp16_kv": "yes"}, "fp16_kv must be true or false"),
        ({"parallel": -1}, "parallel must be >= 0"),
        ({"parallel": 2.0}, "parallel must be an integer, not float"),
        ({"model": ""}, "model must be a short name"),
        ({"model": "models/x.gguf"}, "model must be a short name"),
        ({"model": "/config/x.gguf"}, "the add-on sees files only under"),
        ({"model": "/share/../etc/x.gguf"}, "the add-on sees files only under"),
        ({"model": "/share/x\n.gguf"}, "model must be a short name"),
        ({"model": "hf://owner/repo/a b.gguf"}, "model must be a short name"),
        ({"model": "ftp://host/x.gguf"}, "model must be a short name"),
        ({"api_key": "two words"}, "api_key may hold only visible ASCII"),
        ({"api_key": "kéy"}, "api_key may hold only visible ASCII"),
        ({"mode": "forward"}, "mode 'forward' needs forward_url"),
        ({"mode": "forward", "forward_url": "https://gpu:11434"}, "plain HTTP"),
        ({"mode": "forward", "forward_url": "http://gpu:11434/api"}, "no path"),
        ({"mode": "forward", "forward_url": "http://u:p@gpu:11434"}, "plain HTTP"),
        ({"mode": "forward", "forward_url": "http://gpu:0"}, "port must be a number from 1 to 65535"),
        ({"mode": "forward", "forward_url": "http://gpu:99999"}, "port must be a number from 1 to 65535"),
        ({"mode": "forward", "forward_url": "http://gpu;rm:1"}, "is not a host name or IP address"),
        ({"mode": "forward", "forward_url": "http://bad_host:1"}, "is not a host name or IP address"),
        ({"modle": "x"}, "unknown option"),
    ],
)
def test_bad_options_name_the_option(options, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        render_toml(parse_options(options))


def test_options_must_be_an_object():
    with pytest.raises(ValueError, match="options must be a JSON object"):
        parse_options(["mode", "local"])


@pytest.mark.parametrize(
    ("url", "target"),
    [
        ("http://gpu.lan:8080", ("gpu.lan", 8080)),
        ("http://192.168.1.20", ("192.168.1.20", 11434)),
        ("http://[fd00::20]:11434/", ("fd00::20", 11434)),
    ],
)
def test_forward_target(url, target):
    opts = parse_options({"mode": "forward", "forward_url": url})
    assert (opts.forward_host, opts.forward_port) == target


@pytest.mark.parametrize("text", ["", 'a"b\\c', "tab\tnl\ncr\r", "\x00\x1f\x7f", "ünï ☃ 🦙", "\\u0041"])
def test_toml_strings_round_trip(text):
    assert tomllib.loads(f"s = {toml_string(text)}")["s"] == text


def test_lone_surrogate_is_refused():
    with pytest.raises(ValueError, match="not valid Unicode"):
        toml_string("a\ud800")


def test_main_writes_toml_and_prints_the_plan(tmp_path, capsys):
    options, out = tmp_path / "options.json", tmp_path / "genie.toml"
    options.write_text(json.dumps({"model": "gemma3-270m", "context": 2048, "api_key": "s3cret"}))
    assert main([str(options), str(out)]) == 0
    assert capsys.readouterr().out == "local\n"
    assert tomllib.loads(out.read_text())["ctx"] == 2048
    assert out.stat().st_mode & 0o777 == 0o600  # it holds the API key

    options.write_text(json.dumps({"mode": "forward", "forward_url": "http://gpu:11434"}))
    assert main([str(options), str(out)]) == 0
    assert capsys.readouterr().out == "forward gpu 11434\n"


@pytest.mark.parametrize(("content", "message"), [("{", "error: Expecting"), ('{"context": 1}', "error: context")])
def test_main_reports_bad_input_in_one_line(tmp_path, capsys, content, message):
    options, out = tmp_path / "options.json", tmp_path / "genie.toml"
    options.write_text(content)
    assert main([str(options), str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and not out.exists()
    assert main([str(tmp_path / "missing.json"), str(out)]) == 2


RUN_SH = ADDON_CONFIG.parent / "run.sh"


def _run_sh(tmp_path: Path, options: dict) -> subprocess.CompletedProcess[str]:
    """run.sh with ADDON_DATA in tmp_path and a stand-in genie-daemon that prints how it was started."""
    bin_dir, data = tmp_path / "bin", tmp_path / "data"
    bin_dir.mkdir()
    data.mkdir()
    (data / "options.json").write_text(json.dumps(options))
    fake = bin_dir / "genie-daemon"
    fake.write_text('#!/bin/sh\necho "genie-daemon $* HOME=$HOME"\ncat "$2"\n')
    fake.chmod(0o755)
    python_dir = Path(sys.executable).parent  # python3 must be the interpreter that has genie installed
    path = f"{bin_dir}:{python_dir}:{os.environ['PATH']}"
    repo = str(ADDON_CONFIG.parents[2])  # genie from this checkout, installed or not
    env = os.environ | {"ADDON_DATA": str(data), "PATH": path, "PYTHONPATH": repo}
    return subprocess.run(["bash", str(RUN_SH)], capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)


def test_run_sh_writes_the_config_and_execs_the_daemon(tmp_path):
    r = _run_sh(tmp_path, {"mode": "local", "model": "gemma3-270m", "context": 1024})
    assert r.returncode == 0, r.stderr
    data = tmp_path / "data"
    assert r.stdout.startswith(f"genie-daemon --config {data}/genie.toml HOME={data}/home\n")
    assert tomllib.loads(r.stdout.split("\n", 1)[1])["ctx"] == 1024


def test_run_sh_stops_on_a_bad_option(tmp_path):
    r = _run_sh(tmp_path, {"mode": "local", "context": 10})
    assert r.returncode == 2 and "genie add-on: error: context must be between" in r.stderr
    assert "genie-daemon" not in r.stdout
