"""DaemonConfig: defaults < TOML < GENIE_* < flags; bad values are errors that name the option."""

import sys

import pytest

from genie_common.child_config import WorkerPart, from_arg
from genie_common.config import DaemonConfig, load_config


def test_precedence_and_worker_args(tmp_path, monkeypatch):
    toml = tmp_path / "genie.toml"
    toml.write_text('ctx = 1024\nstream_interval_ms = 2.5\nmodel = "from-toml"\n')
    monkeypatch.setenv("GENIE_CTX", "2048")
    c = load_config(toml, {"model": "from-flag", "max_queue": None})
    assert (c.model, c.ctx, c.stream_interval_ms, c.max_queue) == ("from-flag", 2048, 2.5, DaemonConfig.max_queue)
    part = c.worker_part()
    assert (part.stream_interval_ms, part.engine.ctx) == (2.5, 2048)
    assert from_arg(WorkerPart, c.worker_args()[1]) == part  # what the worker gets is exactly this


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
    assert c.models_dir == str(tmp_path / "toml") and c.worker_part().models_dir == c.models_dir


def test_parallel_from_toml_env_and_flag_reaches_the_worker_only_when_set(tmp_path, monkeypatch):
    """`parallel` (issue 17): requests the worker runs at once. 0, the default, leaves the backend's own
    default; any other value is the worker's."""
    c = DaemonConfig()
    assert c.parallel == 0 and c.worker_part().engine.parallel == 0
    toml = tmp_path / "genie.toml"
    toml.write_text("parallel = 3\n")
    assert load_config(toml).worker_part().engine.parallel == 3
    monkeypatch.setenv("GENIE_PARALLEL", "2")
    assert load_config(toml).parallel == 2
    assert load_config(toml, {"parallel": 5}).parallel == 5
    assert load_config(toml, {"parallel": 0}).worker_part().engine.parallel == 0


def test_ctx_and_mem_budget_reach_the_worker(tmp_path, monkeypatch):
    """`ctx` 0 (the default) is the worker's auto; `mem_budget_mb` (issue 18) its budget."""
    part = DaemonConfig().worker_part()
    assert (part.engine.ctx, part.engine.mem_budget_mb) == (0, 0)
    toml = tmp_path / "genie.toml"
    toml.write_text("ctx = 8192\nmem_budget_mb = 3500\n")
    part = load_config(toml).worker_part()
    assert (part.engine.ctx, part.engine.mem_budget_mb) == (8192, 3500)
    monkeypatch.setenv("GENIE_MEM_BUDGET_MB", "900")
    assert load_config(toml).mem_budget_mb == 900
    with pytest.raises(ValueError, match="mem_budget_mb must be >= 0"):
        DaemonConfig(mem_budget_mb=-1)


@pytest.mark.parametrize(
    ("toml", "env", "flag", "message"),
    [
        ("", "", -1, "parallel must be >= 0"),
        ("", "two", None, "GENIE_PARALLEL='two' is not a valid int"),
        ("parallel = -2\n", "", None, "parallel must be >= 0"),
        ("parallel = 2.5\n", "", None, "parallel = 2.5 is not a valid int"),
        ('parallel = "4"\n', "", None, "parallel = '4' is not a valid int"),
        ("parallel = true\n", "", None, "parallel = True is not a valid int"),
    ],
)
def test_bad_parallel_is_an_error_naming_it(tmp_path, monkeypatch, toml, env, flag, message):
    path = tmp_path / "genie.toml"
    path.write_text(toml)
    if env:
        monkeypatch.setenv("GENIE_PARALLEL", env)
    with pytest.raises(ValueError, match=message):
        load_config(path, {"parallel": flag})


def test_toml_values_of_another_type_are_errors_not_tracebacks(tmp_path):
    """A TOML string where a number belongs failed as a TypeError in __post_init__ (a traceback from
    genie-daemon); now a ValueError naming the file and the option. An integer for a float is fine."""
    path = tmp_path / "genie.toml"
    path.write_text('ctx = "4096"\n')
    with pytest.raises(ValueError, match=r"genie.toml: ctx = '4096' is not a valid int"):
        load_config(path)
    path.write_text("stream_interval_ms = 5\nkv_store = false\n")
    c = load_config(path)
    assert c.stream_interval_ms == 5.0 and isinstance(c.stream_interval_ms, float) and c.kv_store is False


def test_genie_daemon_flag(tmp_path, monkeypatch, capsys):
    """`genie-daemon --parallel N` sets it; a bad value is one line on stderr and exit 2, no traceback."""
    from genie_daemon import __main__ as cli

    served: list[DaemonConfig] = []

    async def serve(config: DaemonConfig) -> int:
        served.append(config)
        return 0

    monkeypatch.setattr(cli, "_serve", serve)
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import fails: the test's event loop policy stays as it is
    none = str(tmp_path / "none.toml")
    assert cli.main(["--config", none, "--parallel", "3"]) == 0 and served[-1].parallel == 3
    assert cli.main(["--config", none, "--parallel", "-1"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == ["genie-daemon: error: parallel must be >= 0 (0: the backend's default)"]
    with pytest.raises(SystemExit) as e:
        cli.main(["--config", none, "--parallel", "many"])
    assert e.value.code == 2 and "--parallel: invalid int value: 'many'" in capsys.readouterr().err
