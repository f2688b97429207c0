"""`OutputText`: a generation's token ids, one at a time, to the text a client sees.

    token id ─(EOS withheld)─▶ IncrementalDetokenizer ─▶ StopMatcher ─▶ text pieces

The server's post-processing (postprocess.py, which goes on to split reasoning and parse tool
calls) and `ninfer.LLM` both read output through this one class, so a stop string ends the
same generation at the same token either way.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from tokenizers import Tokenizer

from ninfer.api.service.detokenize import IncrementalDetokenizer
from ninfer.api.service.stops import StopMatcher


class OutputText:
    """The text of one generation's ids, cut before the first stop string.

    `eos_ids` are withheld from the text unless `ignore_eos`. After a stop string completed,
    `stop_match` names it, `kept_tokens` counts the ids up to and including the one that
    completed it (the caller tells the engine to stop there), and `add` takes no more ids.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        eos_ids: Collection[int],
        ignore_eos: bool = False,
        stops: Sequence[str] = (),
    ) -> None:
        self.detok = IncrementalDetokenizer(tokenizer)
        self.stops = StopMatcher(stops) if stops else None
        self.eos_ids = eos_ids
        self.ignore_eos = ignore_eos
        self.kept_tokens = 0
        self.raw_chars = 0
        self.stop_match: str | None = None

    def add(self, token_id: int) -> str:
        """The text that is now certain after `token_id` (maybe ""). Call only while
        `stop_match` is None."""
        assert self.stop_match is None, "the output already ended at a stop string"
        self.kept_tokens += 1
        if token_id in self.eos_ids and not self.ignore_eos:
            return ""
        raw = self.detok.add(token_id)
        self.raw_chars += len(raw)
        return self._stopped(raw)

    def finish(self) -> str:
        """The text held back at the end of the stream (the detokenizer's tail, which may still
        complete a stop string, then a stop string's unmatched start)."""
        if self.stop_match is not None:
            return ""
        text = self._stopped(self.detok.finish())
        if self.stops is not None and self.stop_match is None:
            text += self.stops.finish()
        return text

    def _stopped(self, text: str) -> str:
        if self.stops is None or not text:
            return text
        fed = self.stops.feed(text)
        if fed.match is not None:
            self.stop_match = fed.match.stop
        return fed.text
