"""Streamed detokenization with stop strings: one text piece per generated token.

A piece never ends inside a UTF-8 sequence or inside what may become a stop string; the held-back
text comes out with a later piece or with the last one (`final=True`).
"""

from __future__ import annotations

from talariad.engine.model import TextTokenizer


class TextStream:
    def __init__(self, tokenizer: TextTokenizer, stop: list[str]) -> None:
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.ids: list[int] = []
        self.emitted = 0  # characters of the decoded text already handed out
        self.fired: str | None = None
        """The stop string that ended the text, once one has."""

    def push(self, token_id: int, final: bool = False) -> tuple[str, bool]:
        """The piece this token releases, and whether the text now contains a stop string."""
        self.ids.append(token_id)
        text = self.tokenizer.decode(self.ids)
        cut = self._stop_at(text)
        if cut is not None:
            return self._take(text, cut), True
        end = len(text) if final else len(text) - self._hold(text)
        return self._take(text, end), False

    def _take(self, text: str, end: int) -> str:
        piece = text[self.emitted : max(end, self.emitted)]
        self.emitted = max(end, self.emitted)
        return piece

    def _stop_at(self, text: str) -> int | None:
        hits = [
            (i, s) for s in self.stop if (i := text.find(s, max(0, self.emitted - len(s) + 1))) >= 0
        ]
        if not hits:
            return None
        at, self.fired = min(hits)
        return at

    def _hold(self, text: str) -> int:
        """Trailing characters to keep back: an incomplete UTF-8 sequence or a stop string's start."""
        if text.endswith("\ufffd"):
            return len(text) - len(text.rstrip("\ufffd"))
        return max(
            (n for s in self.stop for n in range(1, len(s)) if text.endswith(s[:n])), default=0
        )
