"""ds4py.stop.StopMatcher against a brute-force reference that re-scans the
whole text after every piece (what a generation loop without a matcher
would do), on texts split at every character boundary and on random
partitions."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ds4py.stop import FINISH_LENGTH, FINISH_STOP, StopMatcher


def reference(pieces, stops):
    """Generation stops after the first piece whose arrival makes some stop
    string occur in the text; the output is the text before the earliest
    occurrence at that moment. Returns (output, stopped, piece index)."""
    text = ""
    for k, piece in enumerate(pieces):
        text += piece
        starts = [text.find(s) for s in stops if s in text]
        if starts:
            return text[: min(starts)], True, k
    return text, False, None


def longest_pending(text, stops):
    """Longest suffix of text that is a proper prefix of a stop string."""
    best = 0
    for s in stops:
        for n in range(1, len(s)):
            if n <= len(text) and text.endswith(s[:n]):
                best = max(best, n)
    return best


def run(pieces, stops):
    """Drive the matcher; check its invariants after every piece."""
    m = StopMatcher(stops)
    out, text = "", ""
    for k, piece in enumerate(pieces):
        emitted, stopped = m.feed(piece)
        out += emitted
        if stopped:
            assert m.stopped
            assert m.flush() == ""
            assert m.feed("more") == ("", True)
            return out, True, k
        text += piece
        # Everything not emitted is held, and only what could still start a
        # stop string is held.
        assert out + m.held == text
        assert len(m.held) == longest_pending(text, stops)
    out += m.flush()
    return out, False, None


def all_splits(text):
    """Every way to cut text at 0..2 character boundaries, and the split
    into single characters."""
    n = len(text)
    yield [text]
    yield list(text)
    for i in range(n + 1):
        yield [text[:i], text[i:]]
    for i, j in itertools.combinations(range(n + 1), 2):
        yield [text[:i], text[i:j], text[j:]]


CASES = [
    ("Hello world<|im_end|>trailing", ["<|im_end|>"]),
    ("abcabcabd", ["abd"]),                    # overlapping partial matches
    ("aaaab", ["aab"]),                        # self-overlapping stop string
    ("one\n\ntwo", ["\n\n", "two"]),
    ("xxENDyySTOP", ["STOP", "END"]),          # earliest wins, not list order
    ("abcd", ["abcd", "bc"]),                  # shorter string completes first
    ("no stop here", ["zzz", "here!"]),        # a prefix held to the end
    ("stopstart", ["stop"]),                   # match at position 0
    ("émoji 😀 done 😀😀", ["😀😀", "done 😀x"]),
    ("", ["a"]),
    ("tail<", ["<|"]),
]


@pytest.mark.parametrize("text,stops", CASES)
def test_every_split(text, stops):
    for pieces in all_splits(text):
        assert run(pieces, stops) == reference(pieces, stops), pieces


def test_known_outputs():
    assert run(["Hello", " wor", "ld<|im", "_end", "|>x"], ["<|im_end|>"])[:2] == \
        ("Hello world", True)
    # The stop string split into single characters across pieces.
    assert run(list("ab<|im_end|>cd"), ["<|im_end|>"])[:2] == ("ab", True)
    # Not a stop: the held "<|im" is released when the next piece breaks it.
    m = StopMatcher(["<|im_end|>"])
    assert m.feed("a<|im") == ("a", False)
    assert m.held == "<|im"
    assert m.feed("_start") == ("<|im_start", False)
    assert m.flush() == ""
    # Generation ends without a stop: flush releases the held prefix.
    m = StopMatcher(["</s>"])
    assert m.feed("x</") == ("x", False)
    assert m.flush() == "</"
    assert m.matched is None


def test_matched_and_no_stops():
    m = StopMatcher(["b", "cd"])
    assert m.feed("acd") == ("a", True) and m.matched == "cd"
    m = StopMatcher([])
    assert m.feed("anything<|im_end|>") == ("anything<|im_end|>", False)
    assert m.flush() == ""


def test_refusals_and_constants():
    with pytest.raises(ValueError):
        StopMatcher([""])
    with pytest.raises(TypeError):
        StopMatcher([b"x"])
    assert StopMatcher(["a", "a", "b"]).stop_strings == ("a", "b")
    assert (FINISH_STOP, FINISH_LENGTH) == ("stop", "length")


ALPHABET = "ab<|>\n😀"


@settings(max_examples=400, deadline=None)
@given(st.text(ALPHABET, max_size=40),
       st.lists(st.text(ALPHABET, min_size=1, max_size=5), max_size=4),
       st.lists(st.integers(0, 40), max_size=12))
def test_random_partitions(text, stops, cuts):
    cuts = sorted({min(c, len(text)) for c in cuts})
    bounds = [0, *cuts, len(text)]
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    assert run(pieces, stops) == reference(pieces, stops)
