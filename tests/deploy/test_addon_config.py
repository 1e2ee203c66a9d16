"""The Home Assistant add-on's files follow HA's add-on conventions and agree with each other."""

import re
import tomllib
from pathlib import Path, PurePosixPath

import yaml

ADDON = Path(__file__).parents[2] / "deploy/homeassistant"
REPO = ADDON.parents[1]
config = yaml.safe_load((ADDON / "config.yaml").read_text())


def test_required_keys_and_arches():
    for key in ("name", "version", "slug", "description", "arch"):
        assert isinstance(config[key], str if key != "arch" else list) and config[key], key
    assert re.fullmatch(r"[a-z0-9_]+", config["slug"])
    assert {"amd64", "aarch64"} <= set(config["arch"])


def test_port_watchdog_and_stop_timeout():
    assert config["ports"] == {"11434/tcp": 11434}
    assert config["watchdog"] == "http://[HOST]:[PORT:11434]/health"
    # genie's drain (25 s) + worker and KV-store stops must fit before Docker's SIGKILL
    assert config["timeout"] >= 60
    assert config.get("init", True) is True  # the image has no init of its own


def test_every_option_has_a_schema_entry_and_vice_versa():
    options, schema = config["options"], config["schema"]
    assert set(options) <= set(schema)
    # HA: an optional option (`?`) must not have a default, every other one must
    assert {k for k, v in schema.items() if not v.endswith("?")} == set(options)
    assert "local" in schema["mode"] and "forward" in schema["mode"]


def test_translations_cover_every_option_and_port():
    en = yaml.safe_load((ADDON / "translations/en.yaml").read_text())
    assert set(en["configuration"]) == set(config["schema"])
    for key, text in en["configuration"].items():
        assert text["name"] and text["description"], key
    assert set(en["network"]) == set(config["ports"])


def test_backup_exclude_skips_the_kv_and_caches_but_not_the_options():
    # Supervisor matches each pattern with PurePath.match against the path under the add-on's data folder
    data = PurePosixPath("/data/addons/data/local_genie")

    def excluded(rel: str) -> bool:
        return any((data / rel).match(p) for p in config["backup_exclude"])

    for rel in ("kv", "kv/0123abcd.gkv", "models", "models/qwen3-0.6b.gguf", "home/.cache", "home/.cache/genie"):
        assert excluded(rel), rel
    for rel in ("options.json", "genie.toml", "home"):
        assert not excluded(rel), rel


def test_base_image_is_pinned_and_the_same_everywhere():
    build = yaml.safe_load((ADDON / "build.yaml").read_text())["build_from"]
    assert set(build) == set(config["arch"])
    dockerfile = (ADDON / "Dockerfile").read_text()
    default = re.search(r"^ARG BUILD_FROM=(\S+)$", dockerfile, re.M)
    assert default and set(build.values()) == {default.group(1)}
    assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim-bookworm", default.group(1))  # a version, not a moving tag
    assert 'CMD ["/run.sh"]' in dockerfile


def test_docs_and_changelog():
    for name in ("README.md", "DOCS.md", "CHANGELOG.md", "run.sh"):
        assert (ADDON / name).stat().st_size > 0, name
    assert f"## {config['version']}" in (ADDON / "CHANGELOG.md").read_text()
    docs = (ADDON / "DOCS.md").read_text()
    assert "http://<home-assistant-host>:11434" in docs and ":11434/v1" in docs
    assert "forward_url" in docs and "Extended OpenAI Conversation" in docs
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert config["version"] == pyproject["project"]["version"]  # the add-on ships this genie
