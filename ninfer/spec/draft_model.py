"""`--spec draft --draft-model ARTIFACT`: a separate small model proposes the drafts.

The draft model (same tokenizer as the target) runs on its own executor with its own KV pages,
allocated here from its own page pool. Per request it remembers the tokens whose KV it holds;
each round it first catches up on what the target committed since (the longest prefix it
holds still valid; the rest is recomputed, which also covers rejected drafts, pauses and
thinking suffixes), then decodes k tokens one step at a time, all rows of the round batched::

    step 1   chunk tokens[valid:]                 -> d1   (catch-up + first draft)
    step i   decode d(i-1) at len(tokens) + i - 2 -> di   (rows whose window reaches i)

Greedy requests take the argmax; sampled ones draw from q (the plain sampler's processing of
the draft logits) with the request's own generator, and return q for verification.
Attention-only draft models only: a recurrent draft state could not be rolled back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ninfer.runtime.executors.sampler import Sampler, SampleRow
from ninfer.runtime.pages import PagePool
from ninfer.runtime.step import SeqChunk, StepBatch
from ninfer.spec.drafter import NO_DRAFT, Draft, DraftRow, TimedDrafter, agree
from ninfer.spec.verify import processed_logits


@dataclass
class _DraftSeq:
    pages: list[int] = field(default_factory=list)
    fed: list[int] = field(default_factory=list)  # tokens whose KV the pages hold, position order
    fed_ok: int = 0  # leading `fed` entries found committed by the last _prepare (agree)


class DraftModelDrafter(TimedDrafter):
    """Drafts with `executor` (a plan executor of the draft model; attention only)."""

    name = "draft"

    def __init__(self, executor: object, max_chunk: int = 1 << 30) -> None:
        if getattr(executor, "is_hybrid", False):
            raise ValueError("a hybrid draft model cannot roll back its recurrent state")
        self.executor = executor
        self.page_size: int = executor.page_size  # type: ignore[attr-defined]
        self.pool = PagePool(executor.num_pages)  # type: ignore[attr-defined]
        self.max_chunk = max_chunk  # longest catch-up chunk (the draft plan's prefill chunk)
        self._seqs: dict[int, _DraftSeq] = {}
        self.steps = 0  # draft-model forwards run (bench: drafter cost per round)
        self.seconds = 0.0  # wall time spent proposing

    def forget(self, seq_id: int) -> None:
        st = self._seqs.pop(seq_id, None)
        if st is not None:
            self.pool.release(st.pages)

    def _propose(self, rows: Sequence[DraftRow], sampler: Sampler) -> list[Draft]:
        live = [i for i, r in enumerate(rows) if r.k > 0 and self._prepare(r, rows)]
        self._catch_up([rows[i] for i in live])
        drafts: list[list[int]] = [[] for _ in rows]
        probs: list[list[torch.Tensor]] = [[] for _ in rows]
        for step in range(max((rows[i].k for i in live), default=0)):
            active = [i for i in live if rows[i].k > step]
            chunks = []
            for i in active:
                r, st = rows[i], self._seqs[rows[i].seq_id]
                start = len(st.fed)
                ids = tuple(r.tokens[start:]) if step == 0 else (drafts[i][-1],)
                chunks.append(SeqChunk(r.seq_id, ids, start, tuple(st.pages)))
                st.fed.extend(ids)
            logits = self.executor.run(StepBatch(tuple(chunks)))  # type: ignore[attr-defined]
            self.steps += 1
            for row, i in enumerate(active):
                tok, q = choose_draft(logits[row : row + 1], rows[i], drafts[i], sampler)
                drafts[i].append(tok)
                if q is not None:
                    probs[i].append(q)
        out = []
        for i, r in enumerate(rows):
            if not drafts[i]:
                out.append(NO_DRAFT)
                continue
            q = torch.stack(probs[i]) if probs[i] else None
            out.append(Draft(tuple(drafts[i]), q))
        return out

    def _catch_up(self, rows: Sequence[DraftRow]) -> None:
        """Compute long backlogs (a new prompt, a replay) in chunks of at most `max_chunk`
        tokens until each row has at most `max_chunk` tokens left for step 1."""
        while True:
            chunks = []
            for r in rows:
                st = self._seqs[r.seq_id]
                if len(r.tokens) - len(st.fed) > self.max_chunk:
                    ids = tuple(r.tokens[len(st.fed) : len(st.fed) + self.max_chunk])
                    chunks.append(
                        SeqChunk(r.seq_id, ids, len(st.fed), tuple(st.pages), None, False)
                    )
                    st.fed.extend(ids)
            if not chunks:
                return
            self.executor.run(StepBatch(tuple(chunks)))  # type: ignore[attr-defined]
            self.steps += 1

    def _prepare(self, row: DraftRow, rows: Sequence[DraftRow]) -> bool:
        """Keep the valid prefix of the row's draft KV and hold pages through its last draft
        position; False when the pool cannot give them (after taking back the pages of
        requests not in this round)."""
        st = self._seqs.setdefault(row.seq_id, _DraftSeq())
        limit = min(len(st.fed), len(row.tokens) - 1)  # the last token is computed anyway
        valid = st.fed_ok = agree(st.fed, row.tokens, 0, limit, st.fed_ok)
        del st.fed[valid:]
        end = len(row.tokens) + row.k - 1  # positions computed: tokens, then k - 1 drafts
        need = -(-end // self.page_size) - len(st.pages)
        if need > self.pool.num_free:
            keep = {r.seq_id for r in rows}
            for other in [s for s in self._seqs if s not in keep]:
                self.forget(other)
                if need <= self.pool.num_free:
                    break
        if need > 0:
            pages = self.pool.allocate(need)
            if pages is None:
                return False
            st.pages += pages
        return True


def choose_draft(
    logits: torch.Tensor, row: DraftRow, drafts: list[int], sampler: Sampler
) -> tuple[int, torch.Tensor | None]:
    """The next draft of `row` after `drafts` from a drafter's logits [1, vocab], and q (the
    distribution it was drawn from; None for a greedy row: the argmax)."""
    output = list(row.tokens[row.num_prompt :]) + drafts
    x = processed_logits(logits, row.seq_id, row.params, output, ())
    if row.params.greedy:
        return int(x[0].argmax()), None
    q = Sampler.probabilities(x, [row.params])[0]
    gen = sampler.generator(SampleRow(row.seq_id, row.params, output), logits.device)
    return int(torch.multinomial(q, 1, generator=gen)), q
