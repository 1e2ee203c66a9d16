"""DaemonConfig: defaults < TOML < GENIE_* < flags; bad values are errors that name the option."""

import pytest

from genie_daemon.config import DaemonConfig, load_config


def test_precedence_and_worker_args(tmp_path, monkeypatch):
    toml = tmp_path / "genie.toml"
    toml.write_text('ctx = 1024\nstream_interval_ms = 2.5\nmodel = "from-toml"\n')
    monkeypatch.setenv("GENIE_CTX", "2048")
    c = load_config(toml, {"model": "from-flag", "max_queue": None})
    assert (c.model, c.ctx, c.stream_interval_ms, c.max_queue) == ("from-flag", 2048, 2.5, DaemonConfig.max_queue)
    args = c.worker_args()
    assert args[args.index("--stream-interval-ms") + 1] == "2.5" and args[args.index("--ctx") + 1] == "2048"


@pytest.mark.parametrize(
    ("source", "value", "message"),
    [
        ("env", "abc", "GENIE_CTX='abc' is not a valid int"),
        ("flag", -1.0, "stream_interval_ms must be >= 0"),
        ("flag", float("nan"), "stream_interval_ms must be >= 0"),
    ],
)
def test_bad_values_name_the_option(tmp_path, monkeypatch, source, value, message):
    if source == "env":
        monkeypatch.setenv("GENIE_CTX", str(value))
        overrides = {}
    else:
        overrides = {"stream_interval_ms": value}
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(tmp_path / "none.toml", overrides)


def test_unknown_toml_option_is_an_error(tmp_path):
    toml = tmp_path / "genie.toml"
    toml.write_text("strem_interval_ms = 1\n")
    with pytest.raises(ValueError, match="unknown option"):
        load_config(toml)


def test_max_tokens_default_is_an_option_of_at_least_one(tmp_path, monkeypatch):
    """The cap of an answer that asks for none (issue 16): set like every option, and never 0."""
    assert DaemonConfig().max_tokens_default == 1024
    monkeypatch.setenv("GENIE_MAX_TOKENS_DEFAULT", "200")
    assert load_config(tmp_path / "none.toml").max_tokens_default == 200
    with pytest.raises(ValueError, match="max_tokens_default must be >= 1"):
        load_config(tmp_path / "none.toml", {"max_tokens_default": 0})


@pytest.mark.parametrize("host", ["", "  "])
def test_an_empty_http_host_is_an_error_not_every_interface(tmp_path, monkeypatch, host):
    """aiohttp binds every interface for host "": GENIE_HTTP_HOST= must not expose the API (issue 21 item 7)."""
    monkeypatch.setenv("GENIE_HTTP_HOST", host)
    with pytest.raises(ValueError, match="http_host"):
        load_config(tmp_path / "none.toml")
    with pytest.raises(ValueError, match="0.0.0.0"):
        DaemonConfig(http_host=host)


def test_models_dir_is_an_option_passed_to_the_worker(tmp_path, monkeypatch):
    """The models directory (pulled models) follows GENIE_MODELS_DIR like `genie` does, genie.toml and
    flags override it, and the worker looks `-m NAME` up in the daemon's, not in its own default."""
    monkeypatch.setenv("GENIE_MODELS_DIR", str(tmp_path / "env"))
    assert load_config(tmp_path / "none.toml").models_dir == str(tmp_path / "env")
    monkeypatch.delenv("GENIE_MODELS_DIR")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert DaemonConfig().models_dir == str(tmp_path / "data" / "genie" / "models")
    toml = tmp_path / "genie.toml"
    toml.write_text(f'models_dir = "{tmp_path / "toml"}"\n')
    c = load_config(toml)
    args = c.worker_args()
    assert c.models_dir == str(tmp_path / "toml") and args[args.index("--models-dir") + 1] == c.models_dir
