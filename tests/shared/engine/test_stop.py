from shared.engine.stop import StopStringMatcher


def stream(matcher: StopStringMatcher, deltas: list[str]) -> str:
    return "".join(matcher.feed(d) for d in deltas)


def test_stop_string_split_across_deltas_is_cut_and_never_shown() -> None:
    m = StopStringMatcher(("END",))
    shown = stream(m, ["hello E", "N", "D and more"])
    assert shown == "hello " and m.matched == "END"


def test_held_back_text_is_released_when_it_cannot_be_a_stop() -> None:
    m = StopStringMatcher(("END",))
    assert m.feed("abc E") == "abc"  # " E" could start "END"
    assert m.feed("x") == " "  # "Ex" could not, but only 2 chars are held back
    assert m.flush() == "Ex" and m.matched is None


def test_earliest_of_several_stops_wins() -> None:
    m = StopStringMatcher(("bb", "a"))
    assert stream(m, ["xxbbya"]) == "xx" and m.matched == "bb"


def test_no_stops_passes_everything_through() -> None:
    m = StopStringMatcher(())
    assert stream(m, ["a", "b"]) + m.flush() == "ab" and m.matched is None
