"""A model family is an architecture and a record (genie_common/families.py): a new one with reasoning and
tool-call markers of its own is served end to end with nothing else changed. The family here, `toyfam`,
runs llama's architecture under a name of its own (in the product: a file in workers/engine/arch/ and its
entry in the table) and writes `<reason>…</reason>` and `<call>…</call>`."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from genie_common import families
from genie_common.engine_options import EngineOptions
from genie_common.errors import PullError
from genie_common.families import ChatMarkup, Family
from genie_common.models.local import describe_gguf
from genie_workers.engine.arch import ARCHITECTURES, llama
from genie_workers.engine.engine import Engine
from genie_workers.engine.sampling import SamplingParams
from genie_workers.engine.text_filters import ThinkFilter
from genie_workers.output_parser import OutputParser, Piece, ToolCall
from testkit.tiny_models import write_tiny_model

TOY = Family("toyfam", ("toyfam",), ChatMarkup("<reason>", "</reason>", "<call>", "</call>"))


@pytest.fixture
def toyfam(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The family registered (its architecture in the engine's table, its record in the families) and a
    tiny model file of it."""
    monkeypatch.setitem(ARCHITECTURES, "toyfam", dataclasses.replace(llama.SPEC, name="toyfam"))
    monkeypatch.setattr(families, "FAMILIES", (*families.FAMILIES, TOY))
    path = tmp_path / "toy.gguf"
    write_tiny_model("llama", path, seed=2, arch_name="toyfam")
    return path


def test_its_files_are_accepted_and_run(toyfam: Path) -> None:
    assert describe_gguf(toyfam, "toy.gguf")["architecture"] == "toyfam"  # what `genie pull` checks a file by
    engine = Engine(EngineOptions(model=str(toyfam), backend="numpy", ctx=64, parallel=1))
    done = list(engine.generate([3, 17, 40], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)))[-1]
    assert len(done.token_ids) == 5


def test_the_worker_hides_its_reasoning(toyfam: Path) -> None:
    f = ThinkFilter()
    pieces = ["Sure", "<rea", "son>the lamp is in the hall", "</reas", "on>\n\nIt is on."]
    assert "".join(f.feed(p) for p in pieces) + f.flush() == "SureIt is on."


def test_the_worker_sends_its_reasoning_and_calls_typed(toyfam: Path) -> None:
    """The worker's parser (workers/output_parser.py) reads its markup; the daemon gets content, reasoning
    and calls typed and knows no family."""
    p = OutputParser(tools=["light_on"], think=True)
    text = '<reason>the user wants light</reason>\n\n<call>{"name": "light_on", "arguments": {"room": "hall"}}</call>'
    events = [e for chunk in (text[:9], text[9:40], text[40:]) for e in p.feed(chunk)] + p.finish()
    thinking = "".join(e.text for e in events if isinstance(e, Piece) and e.kind == "thinking")
    assert thinking == "the user wants light"
    assert [e for e in events if isinstance(e, ToolCall)] == [ToolCall("light_on", {"room": "hall"})]
    assert not any(isinstance(e, Piece) and e.kind == "content" and e.text.strip() for e in events)


def test_without_its_record_its_files_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "toy.gguf"
    write_tiny_model("llama", path, arch_name="toyfam")
    with pytest.raises(PullError, match="architecture 'toyfam' is not one genie runs"):
        describe_gguf(path, "toy.gguf")
