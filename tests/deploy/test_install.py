"""deploy/install.sh into a scratch root, the systemd unit it installs, and the shell scripts' lint."""

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from genie_common.config import DaemonConfig, load_config

DEPLOY = Path(__file__).parents[2] / "deploy"
INSTALL = DEPLOY / "install.sh"
UNIT = DEPLOY / "systemd/genie.service"
SCRIPTS = [INSTALL, DEPLOY / "stage-addon.sh", DEPLOY / "homeassistant/run.sh"]


def _install(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"PYTHON": sys.executable}
    cmd = ["bash", str(INSTALL), "--root", str(root), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)


def _unit_settings() -> dict[str, str]:
    lines = (line.split("=", 1) for line in UNIT.read_text().splitlines() if re.match(r"^[A-Za-z]+=", line))
    return {key: value for key, value in lines}


def test_dry_run_prints_every_action_and_changes_nothing(tmp_path):
    r = _install(tmp_path, "--dry-run")
    assert r.returncode == 0, r.stderr
    assert list(tmp_path.iterdir()) == []
    for action in ("useradd", "-m venv", "pip install", "genie.service", "genie.toml", "systemctl enable"):
        assert action in r.stdout, action
    assert "systemctl restart genie.service   # not run: --root" in r.stdout


def test_install_into_a_root_then_again_keeps_the_edited_config(tmp_path):
    r = _install(tmp_path, "--no-start", "--skip-pip")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "etc/systemd/system/genie.service").read_text() == UNIT.read_text()
    conf = tmp_path / "etc/genie/genie.toml"
    assert conf.read_text() == (DEPLOY / "systemd/genie.toml").read_text()
    assert conf.stat().st_mode & 0o777 == 0o640  # it may hold the API key
    assert (tmp_path / "opt/genie/venv/bin/python").exists()
    assert "systemctl restart" not in r.stdout and "useradd" in r.stdout  # printed, not run
    if shutil.which("systemd-analyze"):  # install.sh verified the installed unit, and it passed
        assert "+ systemd-analyze verify" in r.stdout

    conf.write_text(conf.read_text() + "# edited\n")
    r = _install(tmp_path, "--no-start", "--skip-pip")
    assert r.returncode == 0, r.stdout + r.stderr
    assert conf.read_text().endswith("# edited\n")
    assert "genie.toml exists: left as it is" in r.stdout and "genie.service is up to date" in r.stdout
    assert "install -D" not in r.stdout and "-m venv" not in r.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--bogus"], "unknown option: --bogus"), (["--source", "/no/such/genie"], "no such file or directory")],
)
def test_bad_arguments_fail_before_changing_anything(tmp_path, args, message):
    r = _install(tmp_path, *args)
    assert r.returncode != 0 and message in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_default_config_loads(monkeypatch):
    for name in DaemonConfig.__dataclass_fields__:
        monkeypatch.delenv(f"GENIE_{name.upper()}", raising=False)
    text = (DEPLOY / "systemd/genie.toml").read_text()
    unknown = set(tomllib.loads(text)) - set(DaemonConfig.__dataclass_fields__)
    if unknown:
        pytest.skip(f"http keys not in DaemonConfig yet: {sorted(unknown)}")
    c = load_config(DEPLOY / "systemd/genie.toml")
    assert (c.http, c.http_host, c.http_port, c.api_key) == (True, "127.0.0.1", 11434, "")
    assert c.kv_cache_dir.startswith("/var/cache/genie/") and c.socket_dir == "/run/genie"


def test_unit_restarts_drains_and_leaves_the_gpu_visible():
    s = _unit_settings()
    assert s["Restart"] == "on-failure" and int(s["StartLimitBurst"]) > 0 and int(s["StartLimitIntervalSec"]) > 0
    # SIGTERM: the running turn may finish (drain_timeout_s), then the worker and the KV store stop
    assert int(s["TimeoutStopSec"]) >= DaemonConfig.drain_timeout_s + 20 and s["KillMode"] == "mixed"
    assert (s["RuntimeDirectory"], s["StateDirectory"], s["CacheDirectory"]) == ("genie", "genie", "genie")
    assert s["ExecStart"].endswith("--config /etc/genie/genie.toml") and s["User"] == "genie"
    assert s["NoNewPrivileges"] == s["ProtectHome"] == s["PrivateTmp"] == "yes" and s["ProtectSystem"] == "strict"
    for closes_devices in ("PrivateDevices", "DevicePolicy", "DeviceAllow", "ProtectClock"):
        assert closes_devices not in s, closes_devices


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze not installed")
def test_systemd_analyze_verify(tmp_path):
    # verify checks that ExecStart's program exists: point it at this Python, keep every other line
    unit = tmp_path / "genie.service"
    unit.write_text(UNIT.read_text().replace("/opt/genie/venv/bin/python", os.path.realpath(sys.executable)))
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout + r.stderr == "", r.stdout + r.stderr


@pytest.mark.skipif(not shutil.which("shellcheck"), reason="shellcheck not installed")
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_shellcheck(script):
    r = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout


@pytest.mark.skipif(not shutil.which("git"), reason="git not installed")
def test_the_quickstart_log_is_ignored_by_git():
    """README's Quickstart writes genie-daemon.log in the clone: it must not show as untracked (issue 16)."""
    root = DEPLOY.parent
    if subprocess.run(["git", "-C", str(root), "rev-parse"], capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    r = subprocess.run(["git", "-C", str(root), "check-ignore", "-q", "genie-daemon.log"], capture_output=True)
    assert r.returncode == 0, "genie-daemon.log is not in .gitignore"
