"""DeltaStream: first piece and sentence ends at once, other text coalesced per interval, nothing lost."""

from genie_workers.delta_stream import DeltaStream


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def make(interval: float = 0.005):
    sent, clock = [], Clock()
    return DeltaStream("r1", sent.append, interval, clock), sent, clock


def test_first_piece_at_once_then_coalesced_until_the_interval():
    s, sent, clock = make()
    s.add("Hello", [1])
    assert [(d.text, d.token_ids) for d in sent] == [("Hello", [1])]
    clock.t += 0.001
    s.add(" there", [2])
    clock.t += 0.001
    s.add(" my", [3])
    assert len(sent) == 1  # within 5 ms of the last send: held
    clock.t += 0.004
    s.add(" friend", [4])
    assert [(d.text, d.token_ids) for d in sent[1:]] == [(" there my friend", [2, 3, 4])]
    assert all(d.request_id == "r1" and not d.sentence_end for d in sent)


def test_sentence_end_goes_at_once_and_is_marked():
    s, sent, clock = make()
    s.add("Hi", [1])
    clock.t += 0.001
    s.add(" you", [2])
    s.add(".", [3])
    assert [(d.text, d.sentence_end) for d in sent] == [("Hi", False), (" you.", True)]
    s.add(" Next", [4])
    s.add("\n", [5])
    assert sent[-1].text == " Next\n" and sent[-1].sentence_end


def test_flush_sends_the_rest_and_nothing_when_empty():
    s, sent, clock = make()
    s.add("a", [1])
    s.add("b", [2])
    s.flush()
    s.flush()
    assert "".join(d.text for d in sent) == "ab" and [i for d in sent for i in d.token_ids] == [1, 2]
    assert len(sent) == 2


def test_token_ids_without_text_are_kept():
    """A token whose text is held back (half a UTF-8 character, a possible stop string) still has its id."""
    s, sent, clock = make()
    s.add("", [7])
    assert [(d.text, d.token_ids) for d in sent] == [("", [7])]
    s.add("", [8])
    clock.t += 1
    s.add("é", [9])
    assert [(d.text, d.token_ids) for d in sent[1:]] == [("é", [8, 9])]
    s.add("", [])
    s.flush()
    assert len(sent) == 2


def test_interval_zero_sends_every_piece():
    s, sent, clock = make(0.0)
    for i, piece in enumerate(["a", "b", "c"]):
        s.add(piece, [i])
    assert [d.text for d in sent] == ["a", "b", "c"]


def test_the_answer_goes_out_typed_one_kind_a_delta_and_a_call_on_its_own():
    """The parser's events (output_parser.py): reasoning and content never share a DELTA, a sentence end
    counts only in content (a voice pipeline speaks that), and a tool call goes at once in a DELTA of its own
    after the text before it; the tokens ride with the first text of their piece."""
    from genie_common.events import Piece, ToolCall
    from genie_protocol.codec import decode, encode

    s, sent, clock = make()
    s.events([Piece("thinking", "The user wants light.")], [1, 2])
    assert [(d.kind, d.text, d.sentence_end) for d in sent] == [("thinking", "The user wants light.", False)]
    clock.t += 0.001
    s.events([Piece("thinking", " Kitchen"), Piece("content", "Turning it on")], [3])
    s.events([ToolCall("HassTurnOn", {"name": "Kitchen Light"})], [4, 5])
    s.events([Piece("content", " now.")], [])
    s.flush()
    got = [(d.kind, d.text, d.token_ids, d.tool_calls, d.sentence_end) for d in sent[1:]]
    assert got == [
        ("thinking", " Kitchen", [3], None, False),
        ("content", "Turning it on", [], None, False),
        ("content", "", [], [{"name": "HassTurnOn", "arguments": {"name": "Kitchen Light"}}], False),
        ("content", " now.", [4, 5], None, True),
    ]
    for d in sent:  # each is a valid DELTA on the wire
        assert decode(encode(d))[0] == d


def test_a_call_with_an_integer_past_64_bits_still_goes_out():
    """JSON has no integer limit and a model may write one; msgpack carries 64 bits. The call goes out with
    the float a JSON reader makes of it (an unsendable DELTA would have ended the worker)."""
    from genie_common.events import ToolCall
    from genie_protocol.codec import decode, encode

    s, sent, _ = make()
    s.call(ToolCall("set", {"level": 10**30, "n": [2**70, 5], "on": True, "ok": 2**63 - 1}))
    (delta,) = sent
    assert delta.tool_calls == [
        {"name": "set", "arguments": {"level": 1e30, "n": [2.0**70, 5], "on": True, "ok": 2**63 - 1}}
    ]
    assert decode(encode(delta))[0] == delta
