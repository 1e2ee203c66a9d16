"""The `genie` command line, run as `python -m genie_workers.cli` in a subprocess: version, help, one-line
errors with exit code 2, tokenize (real models), run / chat / perplexity (a tiny random model)."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from genie_common.gguf_file import GGUFFile
from genie_common.registry import resolve_model
from genie_workers.engine.tokenizer import Tokenizer
from testkit.tiny_models import write_tiny_model

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 60


def genie(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "genie_workers.cli", *args],
        cwd=ROOT,
        input=stdin,
        stdin=None if stdin is not None else subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def assert_one_line_error(r: subprocess.CompletedProcess[str], *fragments: str) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("genie: error:"), r.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert r.stdout == ""
    return lines[0]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "tiny-llama.gguf"
    write_tiny_model("llama", path)
    return path


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny: Path) -> Tokenizer:
    with GGUFFile(tiny) as gf:
        return Tokenizer.from_metadata(gf.metadata, str(tiny))


# -- version and help ------------------------------------------------------------------------------


def test_version() -> None:
    r = genie("--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "genie 0.1.0"


def test_help_lists_commands() -> None:
    r = genie("--help")
    assert r.returncode == 0, r.stderr
    for word in ("run", "chat", "tokenize", "perplexity", "--version"):
        assert word in r.stdout


def _help_entries(text: str) -> dict[str, str]:
    """argparse help -> {option string: its help text}, one entry per option line and its continuations."""
    entries: dict[str, str] = {}
    current: list[str] = []
    for line in text.splitlines():
        m = re.match(r"^  (-\S.*?)(?:\s{2,}(.*))?$", line)
        if m:
            names = re.findall(r"(--?[\w-]+)", m.group(1).split("  ")[0])
            current = names
            for name in names:
                entries[name] = m.group(2) or ""
        elif line.startswith("    ") and current:
            for name in current:
                entries[name] += " " + line.strip()
        else:
            current = []
    return entries


_ENGINE = ["--model", "--backend", "--ctx", "--fp16-kv"]
_SAMPLING = ["--max-tokens", "--temperature", "--top-k", "--top-p", "--min-p", "--repeat-penalty", "--seed"]
_SAMPLING += ["--stop", "--think"]
OPTIONS = {
    "run": [*_ENGINE, "--raw", "--chat", *_SAMPLING, "--json"],
    "chat": [*_ENGINE, "--system", *_SAMPLING],
    "tokenize": ["--model", "--special", "--json"],
    "perplexity": [*_ENGINE, "--json"],
}
REQUIRED = {"run": ["--prompt"], "perplexity": ["--text-file"]}  # no default to state

_help_cache: dict[str, dict[str, str]] = {}


def _help(command: str) -> dict[str, str]:
    if command not in _help_cache:
        r = genie(command, "--help")
        assert r.returncode == 0, r.stderr
        _help_cache[command] = _help_entries(r.stdout)
    return _help_cache[command]


@pytest.mark.parametrize(
    "command,option",
    [(c, o) for c, opts in OPTIONS.items() for o in opts],
)
def test_help_states_default(command: str, option: str) -> None:
    entries = _help(command)
    assert option in entries, f"{option} not in `genie {command} --help`: {sorted(entries)}"
    assert "default" in entries[option], f"{command} {option}: {entries[option]!r}"


@pytest.mark.parametrize("command", [*REQUIRED])
def test_help_lists_required_options(command: str) -> None:
    for option in REQUIRED[command]:
        assert option in _help(command)


def test_help_shows_default_values() -> None:
    run = _help("run")
    assert "(default: 0.8)" in run["--temperature"]
    assert "(default: 1024)" in run["--max-tokens"]
    assert "(default: 40)" in run["--top-k"]
    assert "(default: 512)" in _help("perplexity")["--ctx"]


# -- one-line errors -------------------------------------------------------------------------------


def test_bad_model_file(tmp_path: Path) -> None:
    path = tmp_path / "garbage.gguf"
    path.write_bytes(b"this is not a model" * 10)
    r = genie("run", "-m", str(path), "-p", "hi", "-n", "1")
    assert_one_line_error(r, str(path))


def test_truncated_model_file(tmp_path: Path, tiny: Path) -> None:
    path = tmp_path / "cut.gguf"
    path.write_bytes(tiny.read_bytes()[:5000])
    r = genie("run", "-m", str(path), "-p", "hi", "-n", "1")
    assert_one_line_error(r, str(path), "truncated")


def test_missing_model_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.gguf"
    assert_one_line_error(genie("run", "-m", str(path), "-p", "hi"), str(path))


def test_unknown_short_name() -> None:
    assert_one_line_error(genie("run", "-m", "no-such-model-xyz", "-p", "hi"), "no-such-model-xyz")


def test_negative_temperature(tiny: Path) -> None:
    assert_one_line_error(genie("run", "-m", str(tiny), "-p", "hi", "--temperature", "-1"), "temperature")


def test_tokenize_bad_model_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"")
    assert_one_line_error(genie("tokenize", "-m", str(path), "hello"), str(path))


# -- tokenize (real models) ------------------------------------------------------------------------


def test_tokenize_json_smollm2() -> None:
    r = genie("tokenize", "--json", "-m", "smollm2-135m", "Hello world")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert list(out) == ["ids"]
    path = resolve_model("smollm2-135m", progress=lambda _: None)
    with GGUFFile(path) as gf:
        tokenizer = Tokenizer.from_metadata(gf.metadata, str(path))
    assert out["ids"] == tokenizer.encode("Hello world", add_bos=False)
    assert out["ids"] == [19556, 905]


def test_tokenize_special_gemma() -> None:
    r = genie("tokenize", "-m", "gemma3-270m", "--special", "<start_of_turn>")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "105"


# -- run / chat / perplexity (tiny model) ----------------------------------------------------------


def test_run_json(tiny: Path, tiny_tokenizer: Tokenizer) -> None:
    r = genie("run", "-m", str(tiny), "-p", "hi", "-n", "4", "--temperature", "0", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out) == {"text", "tokens", "prompt_tokens", "cached_tokens", "finish_reason", "timings"}
    assert isinstance(out["text"], str)
    assert 1 <= len(out["tokens"]) <= 4 and all(isinstance(t, int) for t in out["tokens"])
    assert out["prompt_tokens"] == len(tiny_tokenizer.encode("hi"))  # raw prompt: no chat template, with BOS
    assert out["cached_tokens"] == 0
    assert out["finish_reason"] in ("stop", "length")
    assert set(out["timings"]) == {"load_ms", "ttft_ms", "prefill_tok_s", "decode_tok_s"}
    assert all(isinstance(v, (int, float)) and v >= 0 for v in out["timings"].values())
    # greedy is deterministic
    again = json.loads(genie("run", "-m", str(tiny), "-p", "hi", "-n", "4", "--temperature", "0", "--json").stdout)
    assert again["tokens"] == out["tokens"]


def test_run_streaming_prints_timings(tiny: Path) -> None:
    r = genie("run", "-m", str(tiny), "-p", "hello", "-n", "3", "--seed", "1")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    timing = [line for line in r.stderr.splitlines() if "prefill" in line and "decode" in line]
    assert len(timing) == 1, r.stderr
    assert "tok/s" in timing[0]
    assert r.stdout.endswith("\n")


def test_perplexity_json(tmp_path: Path, tiny: Path, tiny_tokenizer: Tokenizer) -> None:
    text = "abc hello dog cafe bad egg head " * 3
    f = tmp_path / "text.txt"
    f.write_text(text, encoding="utf-8")
    r = genie("perplexity", "-m", str(tiny), "--text-file", str(f), "--ctx", "16", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    n_tokens = len(tiny_tokenizer.encode(text, add_bos=False))
    assert n_tokens > 2 * 15  # several windows of [BOS] + 15 tokens
    # the tiny model adds BOS: windows [BOS] + tokens[i : i + 15], step 15, so every token is scored once
    assert out["n_scored"] == n_tokens
    assert len(out["nll"]) == n_tokens
    assert all(x >= 0 for x in out["nll"])
    mean = sum(out["nll"]) / len(out["nll"])
    assert out["ppl"] == pytest.approx(math.exp(mean), rel=1e-4)


def test_perplexity_missing_text_file(tmp_path: Path, tiny: Path) -> None:
    path = tmp_path / "missing.txt"
    r = genie("perplexity", "-m", str(tiny), "--text-file", str(path), "--ctx", "16")
    assert_one_line_error(r, str(path))


def test_perplexity_missing_model_file(tmp_path: Path) -> None:
    f = tmp_path / "text.txt"
    f.write_text("hello", encoding="utf-8")
    path = tmp_path / "absent.gguf"
    assert_one_line_error(genie("perplexity", "-m", str(path), "--text-file", str(f)), str(path))


def test_perplexity_bad_ctx(tmp_path: Path, tiny: Path) -> None:
    f = tmp_path / "text.txt"
    f.write_text("hello world", encoding="utf-8")
    assert_one_line_error(genie("perplexity", "-m", str(tiny), "--text-file", str(f), "--ctx", "1"), "--ctx")


def test_chat_from_stdin(tiny: Path) -> None:
    r = genie("chat", "-m", str(tiny), "-n", "3", "--seed", "0", stdin="hello\n")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    assert any("prefill" in line and "decode" in line for line in r.stderr.splitlines()), r.stderr
