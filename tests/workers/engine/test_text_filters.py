from genie_workers.engine.text_filters import StopMatcher, ThinkFilter


def feed_all(m: StopMatcher, pieces: list[str]) -> tuple[str, bool]:
    out = []
    for p in pieces:
        text, hit = m.feed(p)
        out.append(text)
        if hit:
            return "".join(out), True
    out.append(m.flush())
    return "".join(out), False


def test_stop_string_split_across_pieces_is_found_and_cut():
    assert feed_all(StopMatcher(("END",)), ["abc E", "N", "D tail"]) == ("abc ", True)


def test_partial_stop_is_held_back_then_released():
    m = StopMatcher(("STOP",))
    assert m.feed("go ST") == ("go ", False)
    assert m.feed("ill") == ("STill", False)


def test_earliest_of_several_stop_strings_wins():
    assert feed_all(StopMatcher(("bb", "a")), ["xxbba"]) == ("xx", True)


def test_no_stop_strings_passes_everything():
    assert feed_all(StopMatcher(()), ["a", "b"]) == ("ab", False)


def test_think_filter_drops_reasoning_across_pieces():
    f = ThinkFilter()
    pieces = ["<thi", "nk>\nsecret", " plan</th", "ink>\n\nAnswer: 4", "<"]
    out = "".join(f.feed(p) for p in pieces) + f.flush()
    assert out == "Answer: 4<"


def test_think_filter_keeps_text_without_tags():
    f = ThinkFilter()
    assert f.feed("a < b") + f.flush() == "a < b"


def test_think_filter_drops_newlines_after_the_block_when_they_come_as_their_own_pieces():
    f = ThinkFilter()
    out = "".join(f.feed(p) for p in ["<think>", "plan", "</think>", "\n\n", "\n", "Hi", "\n!"]) + f.flush()
    assert out == "Hi\n!"


def test_think_filter_drops_gemma4_thought_blocks_in_every_split():
    text = "<|channel>thought\nplan it<channel|>It is 4.<|channel>thought\n<channel|> Bye <think>x</think>!"
    for step in (1, 2, 3, 7, len(text)):
        f = ThinkFilter()
        out = "".join(f.feed(text[i : i + step]) for i in range(0, len(text), step)) + f.flush()
        assert out == "It is 4. Bye !", step
