"""Chooses the next token of each logits row: penalties, temperature, top-k, top-p, min-p.

Each request draws from its own `torch.Generator`, seeded from `SamplingParams.seed` (or a fresh
random seed), and draws exactly once per sampled token. A request's tokens therefore do not
depend on which other requests share its batch, nor on pauses and replays (which never sample).

Rows whose request sets `SamplingParams.logprobs` also get the log probabilities of the final
distribution (logprobs.py), computed after the draw from the same tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from ninfer.runtime.executors.logprobs import LogprobRows, row_logprobs
from ninfer.runtime.request import SamplingParams, TokenLogprob


class SampleRow(NamedTuple):
    """One logits row to sample: its request, parameters and generated tokens so far (for
    presence/frequency penalties)."""

    seq_id: int
    params: SamplingParams
    output_ids: Sequence[int]


class SampledTokens:
    """The token chosen for each row of a step, as a device tensor (`ids`, int64 [rows]) that
    the next step can read without a host round trip, and a copy on its way to the host:
    `tolist()` waits for that copy only. `logprobs`: the asking rows' log probabilities, copied
    with the ids (`logprob_entries`)."""

    def __init__(self, ids: torch.Tensor, logprobs: LogprobRows | None = None) -> None:
        self.ids = ids
        self.logprobs = logprobs
        self._ready: torch.cuda.Event | None = None
        if ids.device.type == "cuda":
            self._host = torch.empty(ids.shape, dtype=ids.dtype, pin_memory=True)
            self._host.copy_(ids, non_blocking=True)
            if logprobs is not None:
                logprobs.start_copy()
            self._ready = torch.cuda.Event()
            self._ready.record()
        else:
            self._host = ids

    def tolist(self) -> list[int]:
        if self._ready is not None:
            self._ready.synchronize()
        return self._host.tolist()

    def logprob_entries(self) -> list[TokenLogprob | None]:
        """One entry per row: its `TokenLogprob`, or None when its request did not ask."""
        ids = self.tolist()
        if self.logprobs is None:
            return [None] * len(ids)
        return self.logprobs.entries(ids, len(ids))


class Sampler:
    """Stateless except for one generator per live request; call `forget` when it finishes."""

    def __init__(self) -> None:
        self._generators: dict[int, torch.Generator] = {}

    def forget(self, seq_id: int) -> None:
        self._generators.pop(seq_id, None)

    def sample(self, logits: torch.Tensor, rows: Sequence[SampleRow]) -> list[int]:
        """logits: [len(rows), vocab] (any float dtype, any device). Returns one token id per
        row. Does not modify `logits`."""
        return self.sample_async(logits, rows).tolist()

    def sample_async(
        self,
        logits: torch.Tensor,
        rows: Sequence[SampleRow],
        mask: Callable[[torch.Tensor], torch.Tensor] | None = None,
        logits_rows: Sequence[int] | None = None,
    ) -> SampledTokens:
        """`sample` without waiting: the ids stay on `logits`' device until `tolist()`. Every
        draw is queued now, in row order, so a request's generator advances as with `sample`.
        `mask` (constrained decoding, ninfer.constrain.state): [rows, vocab] fp32 -> a copy with
        disallowed tokens at -inf, applied before everything else. `logits_rows`: row i
        samples from `logits[logits_rows[i]]` (several choices of one prompt share a row)."""
        if logits_rows is not None:
            index = torch.tensor(list(logits_rows), dtype=torch.long).to(logits.device)
            logits = logits.index_select(0, index)
        assert logits.dim() == 2 and logits.shape[0] == len(rows), (logits.shape, len(rows))
        x = logits.float()  # [rows, vocab]; a copy when the dtype differs
        if mask is not None:
            x = mask(x)
        if any(r.params.presence_penalty or r.params.frequency_penalty for r in rows):
            x = self.penalize(x.clone(), rows)
        out = x.argmax(dim=-1)
        idx = [i for i, r in enumerate(rows) if not r.params.greedy]
        kept: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        if idx:
            sorted_x, keep, order, probs = self._filter(x[idx], [rows[i].params for i in idx])
            kept = (sorted_x, keep, order)
            for j, i in enumerate(idx):
                gen = self.generator(rows[i], logits.device)
                out[i : i + 1] = torch.multinomial(probs[j], 1, generator=gen)
        asks = [i for i, r in enumerate(rows) if r.params.logprobs is not None]
        if not asks:
            return SampledTokens(out)
        return SampledTokens(out, self._logprobs(x, out, rows, asks, idx, kept))

    def _logprobs(
        self,
        x: torch.Tensor,
        out: torch.Tensor,
        rows: Sequence[SampleRow],
        asks: list[int],
        idx: list[int],
        kept: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None,
    ) -> LogprobRows:
        """The asking rows' log probabilities (logprobs.py): greedy rows from the penalised
        logits, sampled rows from the filtered, temperature-scaled ones `_filter` returned."""
        where = {i: j for j, i in enumerate(idx)}  # logits row -> its row of `kept`
        logp = x.new_empty((len(asks), x.shape[1]))  # [m, vocab]
        greedy = [m for m, i in enumerate(asks) if i not in where]
        if greedy:
            logp[greedy] = torch.log_softmax(x[[asks[m] for m in greedy]], dim=-1)
        sampled = [m for m, i in enumerate(asks) if i in where]
        if sampled and kept is not None:
            sorted_x, keep, order = (t[[where[asks[m]] for m in sampled]] for t in kept)
            masked = sorted_x.masked_fill(~keep, float("-inf")).log_softmax(dim=-1)
            logp[sampled] = torch.empty_like(masked).scatter_(-1, order, masked)
        ks = [rows[i].params.logprobs or 0 for i in asks]
        return row_logprobs(logp, out, asks, ks)

    @staticmethod
    def probabilities(x: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
        """The distribution sampled from: softmax(x / T) restricted by top-k, then top-p, then
        min-p, renormalised. x: [n, vocab] fp32 (penalties already applied)."""
        return Sampler._filter(x, params)[3]

    @staticmethod
    def _filter(
        x: torch.Tensor, params: Sequence[SamplingParams]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """`probabilities`, with what it was made of: (sorted_x, keep, order, probs), where
        sorted_x [n, vocab] is x / T sorted descending, order its token ids, keep [n, vocab]
        bool the tokens the filters keep (a prefix of each sorted row), probs as
        `probabilities`."""
        vocab = x.shape[1]
        temp = torch.tensor([p.temperature for p in params], dtype=x.dtype, device=x.device)
        x = x / temp.clamp_min(1e-5)[:, None]
        sorted_x, order = x.sort(dim=-1, descending=True)  # [n, vocab]
        keep = torch.ones_like(sorted_x, dtype=torch.bool)
        ranks = torch.arange(vocab, device=x.device)[None, :]
        top_k = torch.tensor([p.top_k if p.top_k > 0 else vocab for p in params], device=x.device)
        keep &= ranks < top_k[:, None]
        sorted_p = torch.softmax(sorted_x.masked_fill(~keep, float("-inf")), dim=-1)
        top_p = torch.tensor([p.top_p for p in params], dtype=x.dtype, device=x.device)
        before = sorted_p.cumsum(dim=-1) - sorted_p  # mass strictly above each token
        # the top token is always kept; top_p 1 keeps everything (an fp32 cumsum over a large
        # vocabulary reaches 1.0 before its tail, which `before < 1` would drop)
        keep &= (before < top_p[:, None]) | (top_p[:, None] >= 1.0)
        min_p = torch.tensor([p.min_p for p in params], dtype=x.dtype, device=x.device)
        keep &= sorted_p >= min_p[:, None] * sorted_p[:, :1]
        sorted_p = sorted_p * keep
        sorted_p = sorted_p / sorted_p.sum(dim=-1, keepdim=True)
        return sorted_x, keep, order, torch.zeros_like(sorted_p).scatter_(-1, order, sorted_p)

    @staticmethod
    def penalize(x: torch.Tensor, rows: Sequence[SampleRow]) -> torch.Tensor:
        """Subtract each row's presence/frequency penalties from `x` [len(rows), vocab] fp32
        in place (counts from the row's `output_ids`); returns `x`."""
        vocab = x.shape[1]
        for i, r in enumerate(rows):
            p = r.params
            if not (p.presence_penalty or p.frequency_penalty) or not r.output_ids:
                continue
            ids = torch.tensor(list(r.output_ids), dtype=torch.long, device=x.device)
            counts = torch.bincount(ids.clamp(0, vocab - 1), minlength=vocab).to(x.dtype)
            x[i] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(x.dtype)
        return x

    def generator(self, row: SampleRow, device: torch.device) -> torch.Generator:
        """The request's own generator (created, seeded, on first use). Speculative decoding
        draws its drafts, acceptance tests and residual samples from it too, so a seed fixes
        the whole output."""
        gen = self._generators.get(row.seq_id)
        if gen is None:
            gen = torch.Generator(device=device)
            if row.params.seed is None:
                gen.seed()
            else:
                gen.manual_seed(row.params.seed)
            self._generators[row.seq_id] = gen
        return gen
