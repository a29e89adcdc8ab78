"""Stop strings, matched across token boundaries, for streamed text.

A generation loop decodes each new token to a piece of text and feeds it to
``StopMatcher.feed``. The matcher returns the text that is safe to show now
and whether generation must stop:

- It holds back the longest suffix of the text seen so far that is a proper
  prefix of some stop string (it might become one with the next piece), and
  releases it as soon as it can no longer start a match.
- When a stop string appears, the text before its first occurrence (the
  earliest starting one, over all stop strings) is released and the stop
  string and everything after it are dropped: OpenAI semantics, the returned
  text never contains the stop string.
- A match may span any number of pieces.

At the end of a generation that did not stop on a string (max tokens, end of
sequence token), ``flush()`` returns the held-back text.

The matcher works on ``str``: incomplete UTF-8 sequences must be completed by
the detokenizer before the text reaches it.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["StopMatcher", "FINISH_STOP", "FINISH_LENGTH"]

# OpenAI finish_reason values: "stop" for an end-of-sequence token or a stop
# string, "length" when max_tokens (or the context) ran out.
FINISH_STOP = "stop"
FINISH_LENGTH = "length"


class StopMatcher:
    """Incremental stop-string matcher (see the module docstring)."""

    def __init__(self, stop_strings: Iterable[str] = ()):
        stops = []
        for s in stop_strings:
            if not isinstance(s, str):
                raise TypeError(f"stop strings must be str, got {type(s).__name__}")
            if s == "":
                raise ValueError("an empty stop string would stop before any text")
            if s not in stops:
                stops.append(s)
        self.stop_strings: tuple[str, ...] = tuple(stops)
        # Every proper prefix of a stop string, for the hold-back test.
        self._prefixes = frozenset(s[:i] for s in stops for i in range(1, len(s)))
        self._max_hold = max((len(s) - 1 for s in stops), default=0)
        self._held = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended generation

    def _hold_len(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix
        of a stop string."""
        for n in range(min(self._max_hold, len(text)), 0, -1):
            if text[-n:] in self._prefixes:
                return n
        return 0

    def feed(self, piece: str) -> tuple[str, bool]:
        """Add ``piece``; return (text safe to emit now, stopped)."""
        if self.stopped:
            return "", True
        if not self.stop_strings:
            return piece, False
        buf = self._held + piece
        # Any match starts inside buf: what was emitted before held no stop
        # string and ended in no prefix of one longer than what was held.
        first = -1
        for s in self.stop_strings:
            i = buf.find(s)
            if i >= 0 and (first < 0 or i < first):
                first, self.matched = i, s
        if first >= 0:
            self.stopped = True
            self._held = ""
            return buf[:first], True
        h = self._hold_len(buf)
        self._held = buf[len(buf) - h:] if h else ""
        return buf[: len(buf) - h], False

    def flush(self) -> str:
        """The held-back text, at the end of a generation that did not stop
        on a string (empty after a stop)."""
        out, self._held = ("" if self.stopped else self._held), ""
        return out

    @property
    def held(self) -> str:
        """Text fed but not yet released."""
        return self._held
