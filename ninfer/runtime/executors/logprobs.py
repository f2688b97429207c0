"""Log probabilities of sampled tokens, computed on the device for the rows that ask.

A request asks with `SamplingParams.logprobs = k` (0..20): every token the sampler chooses for it
then carries a `TokenLogprob` (request.py): the chosen token's log probability and the k most
likely tokens with theirs. The values describe the distribution the token was actually chosen
from, after everything the sampler applied:

- greedy rows (temperature 0): `log_softmax(z)`, z the logits after presence / frequency
  penalties (the raw model logits when the request has none): the values whose argmax was taken;
- sampled rows: `log_softmax(z / T)` over the tokens top-k, top-p and min-p keep, -inf for the
  tokens they remove: exactly the renormalised distribution `torch.multinomial` drew from
  (`Sampler.probabilities`).

Only the rows that ask pay for it: one log-softmax and one top-k over their vocabulary rows,
queued on the device with the draws, and copied to the host with the sampled ids (one wait, in
`SampledTokens.tolist`). `LogprobLedger` (logprob_ledger.py) carries each request's entry from
the commit of its token to the `TokensEvent` that publishes it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ninfer.runtime.request import TokenLogprob


class LogprobRows:
    """The log probabilities of one step's asking rows, on their way to the host.

    `rows`: the logits-row index of each asking row; `ks`: how many alternatives each wants.
    chosen: [m] fp32; top_ids: [m, K] int64; top_lp: [m, K] fp32, K = max(ks) (may be 0).
    """

    def __init__(
        self,
        rows: Sequence[int],
        ks: Sequence[int],
        chosen: torch.Tensor,
        top_ids: torch.Tensor,
        top_lp: torch.Tensor,
    ) -> None:
        self.rows, self.ks = list(rows), list(ks)
        self._tensors = (chosen, top_ids, top_lp)
        self._host = self._tensors

    def start_copy(self) -> None:
        """Queue the device-to-host copies (call before recording the step's ready event)."""
        if self._tensors[0].device.type != "cuda":
            return
        host = []
        for t in self._tensors:
            h = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            h.copy_(t, non_blocking=True)
            host.append(h)
        self._host = tuple(host)

    def entries(self, ids: Sequence[int], num_rows: int) -> list[TokenLogprob | None]:
        """One entry per logits row (None for rows that did not ask); `ids` the sampled ids of
        every row. Call once the copies are complete."""
        chosen, top_ids, top_lp = (t.tolist() for t in self._host)
        out: list[TokenLogprob | None] = [None] * num_rows
        for j, (row, k) in enumerate(zip(self.rows, self.ks)):
            top = tuple(zip(top_ids[j][:k], top_lp[j][:k]))
            out[row] = TokenLogprob(int(ids[row]), float(chosen[j]), top)
        return out


def row_logprobs(
    logp: torch.Tensor, sampled: torch.Tensor, rows: Sequence[int], ks: Sequence[int]
) -> LogprobRows:
    """logp: [m, vocab] fp32 log-probabilities of the asking rows `rows` (in that order);
    sampled: [rows] int64, every row's chosen id. Gathers each chosen id's value and the top
    max(ks) entries of each row (sorted, most likely first)."""
    index = torch.tensor(list(rows), dtype=torch.long, device=logp.device)
    chosen = logp.gather(1, sampled.index_select(0, index)[:, None])[:, 0]  # [m]
    k = max(ks, default=0)
    if k > 0:
        top_lp, top_ids = logp.topk(min(k, logp.shape[1]), dim=-1)  # [m, k], descending
    else:
        top_lp = logp.new_empty((logp.shape[0], 0))
        top_ids = torch.empty((logp.shape[0], 0), dtype=torch.long, device=logp.device)
    return LogprobRows(rows, ks, chosen, top_ids, top_lp)
