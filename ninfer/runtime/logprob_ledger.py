"""`LogprobLedger`: sampled tokens' log probabilities between their commit and their event.

No torch import (the scheduler's side of the engine reads it).
"""

from __future__ import annotations

from collections.abc import Sequence

from ninfer.runtime.request import TokenLogprob


class LogprobLedger:
    """Per request, the entries of committed tokens not yet published (the engine worker's).

    The engine records a step's entries right after committing it and publishes that commit's
    tokens before it commits the next step, so a request has at most one entry waiting: the
    one for the sampled token it committed last. A published token takes it when the ids
    match; a token committed without sampling (a thinking-budget suffix) gets None."""

    def __init__(self) -> None:
        self._waiting: dict[int, TokenLogprob] = {}

    def record(self, seq_ids: Sequence[int], entries: Sequence[TokenLogprob | None]) -> None:
        for seq_id, entry in zip(seq_ids, entries):
            if entry is not None:
                self._waiting[seq_id] = entry

    def take(self, seq_id: int, tokens: Sequence[int]) -> tuple[TokenLogprob | None, ...]:
        """The entries of `tokens`, newly published for `seq_id`, in order."""
        out: list[TokenLogprob | None] = []
        for t in tokens:
            entry = self._waiting.get(seq_id)
            if entry is not None and entry.token_id == t:
                del self._waiting[seq_id]
                out.append(entry)
            else:
                out.append(None)
        return tuple(out)

    def forget(self, seq_id: int) -> None:
        self._waiting.pop(seq_id, None)
