"""One speculative step of the engine: window, propose, widen, one target forward, verify.

    plan (scheduled as usual: decode rows of one token, prefill chunks)
      │ spec_window per decode row (runtime/speculation.py)    k_i in 0..--draft-tokens
      ▼ drafter.propose(rows with k_i > 0)                      up to k_i drafts per row
      ▼ scheduler.widen(plan, drafts)                           verify chunks, pages reserved
      ▼ executor.run(batch)                                     ONE forward, k_i + 1 logits rows
    ▼ drafter.observe(batch, executor.hidden)                 (MTP) the target's hidden rows
      ▼ verify_row per verify chunk, the plain sampler for every other row
    Accepted: per logits chunk an int (plain row) or the round's tokens (verify chunk), which
    Scheduler.commit takes.

Rows with different k, rows without drafts and prefill chunks share the step. The engine's
overlap (launching a step before the previous one is read) is off while speculating: the next
round's drafts need the committed tokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ninfer.runtime.executors.sampler import Sampler, SampleRow
from ninfer.spec.drafter import NO_DRAFT, Draft, Drafter, DraftRow
from ninfer.spec.verify import verify_row

if TYPE_CHECKING:
    from ninfer.runtime.scheduler import Scheduler, StepPlan


class Accepted:
    """The committed choice per logits chunk, with the `tolist()` the engine waits on, and the
    log probabilities of the rows that asked for them (`logprobs` None when none did; only
    plain rows can ask: a request that wants logprobs does not speculate)."""

    def __init__(
        self, chosen: list[int | tuple[int, ...]], entries: list[Any] | None = None
    ) -> None:
        self._chosen = chosen
        self._entries = entries
        self.logprobs = entries

    def tolist(self) -> list[int | tuple[int, ...]]:
        return self._chosen

    def logprob_entries(self) -> list[Any]:
        return self._entries if self._entries is not None else [None] * len(self._chosen)


class Speculator:
    """Runs the speculative steps of an engine with `drafter` (see the module docstring)."""

    def __init__(self, drafter: Drafter) -> None:
        self.drafter = drafter
        self.verify_seconds = 0.0  # host time of verification (bench)

    @property
    def name(self) -> str:
        return self.drafter.name

    def forget(self, seq_id: int) -> None:
        self.drafter.forget(seq_id)

    def observe(self, batch: Any, executor: Any) -> None:
        """The target just ran `batch`: hand a drafter that reads the target's hidden states
        (MTP: `observe(batch, hidden)`) the rows `executor` captured. Every target step of a
        speculating engine passes here, plain ones (constrained rows) included."""
        hook = getattr(self.drafter, "observe", None)
        hidden = getattr(executor, "hidden", None)
        if hook is not None and hidden:
            hook(batch, hidden)

    def launch(
        self, sched: Scheduler, plan: StepPlan, executor: Any, sampler: Sampler
    ) -> tuple[StepPlan, Accepted]:
        """Draft for `plan`'s decode rows, run the widened batch and verify it; returns the
        plan that ran (commit that one) and the accepted tokens."""
        rows = []
        for seq, chunk in zip(plan.chunk_seqs, plan.batch.chunks):
            k = sched.spec_window(seq) if chunk.want_logits and len(chunk.token_ids) == 1 else 0
            if k > 0:
                p = seq.request.sampling
                rows.append(DraftRow(seq.seq_id, seq.tokens, seq.num_prompt, k, p))
        drafts: dict[int, Draft] = {}
        if rows:
            vocab = getattr(executor, "vocab_size", None)  # drafts past it (padding ids) stop
            for row, d in zip(rows, self.drafter.propose(rows, sampler)):
                n = next((i for i, t in enumerate(d.tokens) if vocab and t >= vocab), None)
                if n is not None:
                    d = Draft(d.tokens[:n], d.probs[:n] if d.probs is not None else None)
                if d.tokens:
                    drafts[row.seq_id] = d
            plan = sched.widen(plan, {i: d.tokens for i, d in drafts.items()})
        logits = executor.run(plan.batch)  # [sum of num_logits, vocab]
        self.observe(plan.batch, executor)
        chosen: list[Any] = []
        plain: list[tuple[int, int, SampleRow]] = []  # (index in chosen, logits row, row)
        r = 0
        for seq, chunk in zip(plan.chunk_seqs, plan.batch.chunks):
            if not chunk.want_logits:
                continue
            n = chunk.num_logits
            if n > 1:
                d = drafts.get(seq.seq_id, NO_DRAFT)
                d = Draft(chunk.token_ids[1:], d.probs[: n - 1] if d.probs is not None else None)
                x = logits[r : r + n]
                chosen.append(
                    verify_row(x, d, seq.seq_id, seq.request.sampling, seq.outputs, sampler)
                )
            else:
                plain.append(
                    (len(chosen), r, SampleRow(seq.seq_id, seq.request.sampling, seq.outputs))
                )
                chosen.append(None)
            r += n
        entries: list[Any] | None = None
        if plain:
            index = torch.tensor([p[1] for p in plain], device=logits.device)
            sampled = sampler.sample_async(logits.index_select(0, index), [p[2] for p in plain])
            for (i, _, _), tok in zip(plain, sampled.tolist()):
                chosen[i] = tok
            if sampled.logprobs is not None:
                entries = [None] * len(chosen)
                for (i, _, _), e in zip(plain, sampled.logprob_entries()):
                    entries[i] = e
        return plan, Accepted(chosen, entries)
