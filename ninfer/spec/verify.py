"""Verification of a round: which drafts the target accepts, and the token it adds.

The target computed logits at the fed token and at each of the k drafts in one forward:
logits[j] is the target's distribution for the token after draft j (logits[0]: after the fed
token). Both sides use the same processing as the plain sampler (runtime/executors/sampler.py): penalties
counted over the output so far plus the drafts before the position, then temperature, top-k,
top-p, min-p.

    greedy   accept while argmax(logits[j]) == d[j+1]; then the argmax at the first mismatch
             (or after all k drafts, the bonus): exactly the tokens plain greedy decoding gives
    sampled  draft j+1 drawn from q_j is accepted with probability min(1, p_j(d) / q_j(d));
             on the first rejection the token is drawn from the normalised residual
             max(0, p_j - q_j); when all k pass, a bonus token is drawn from p_k. Every token
             is then distributed exactly as p (Leviathan et al. 2023, Chen et al. 2023), and
             all draws come from the request's own generator, so a seed fixes the output.

A row with no drafts draws once from p_0, as the plain sampler does.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ninfer.runtime.executors.sampler import Sampler, SampleRow
from ninfer.runtime.request import SamplingParams
from ninfer.spec.drafter import Draft


def processed_logits(
    logits: torch.Tensor, seq_id: int, params: SamplingParams, output_ids: Sequence[int],
    drafts: Sequence[int],
) -> torch.Tensor:  # fmt: skip
    """logits [n, vocab] (n <= len(drafts) + 1) as fp32 with the penalties of each position:
    row j counts `output_ids` followed by drafts[:j]. A copy; `logits` is not modified."""
    x = logits.float().clone()
    if params.presence_penalty or params.frequency_penalty:
        out = list(output_ids)
        rows = [SampleRow(seq_id, params, out + list(drafts[:j])) for j in range(x.shape[0])]
        x = Sampler.penalize(x, rows)
    return x


def rejection_sample(
    p: torch.Tensor, q: torch.Tensor | None, drafts: Sequence[int], gen: torch.Generator
) -> tuple[int, ...]:
    """Speculative sampling of one row. p [k+1, vocab]: the target's distributions; q [k, vocab]
    the distributions the k `drafts` were drawn from (None: drawn deterministically, q one-hot).
    Returns the accepted drafts followed by one token from the target (residual or bonus)."""
    k = len(drafts)
    if q is not None and q.shape[-1] != p.shape[-1]:  # a draft vocabulary padded differently
        width = min(q.shape[-1], p.shape[-1])
        q = torch.nn.functional.pad(q[:, :width], (0, p.shape[-1] - width))
    for j, tok in enumerate(drafts):
        qj = q[j] if q is not None else None
        q_tok = float(qj[tok]) if qj is not None else 1.0
        u = float(torch.rand((), generator=gen, device=p.device))
        if u * q_tok < float(p[j, tok]):
            continue
        if qj is None:
            residual = p[j].clone()
            residual[tok] = 0.0
        else:
            residual = (p[j] - qj).clamp_min(0.0)
        if float(residual.sum()) <= 0.0:  # p <= q nowhere: only reachable through rounding
            residual = p[j]
        r = int(torch.multinomial(residual, 1, generator=gen))
        return (*drafts[:j], r)
    return (*drafts, int(torch.multinomial(p[k], 1, generator=gen)))


def verify_row(
    logits: torch.Tensor,
    draft: Draft,
    seq_id: int,
    params: SamplingParams,
    output_ids: Sequence[int],
    sampler: Sampler,
) -> tuple[int, ...]:
    """The tokens one round commits for a row: logits [k+1, vocab] of the verify chunk, the
    draft it verified (k tokens). Greedy rows accept exactly the argmax path; others are
    rejection-sampled with the request's generator (module docstring)."""
    d = draft.tokens
    assert logits.shape[0] == len(d) + 1, (logits.shape, len(d))
    x = processed_logits(logits, seq_id, params, output_ids, d)
    if params.greedy:
        best = x.argmax(dim=-1).tolist()
        j = 0
        while j < len(d) and best[j] == d[j]:
            j += 1
        return (*d[:j], best[j])
    p = Sampler.probabilities(x, [params] * x.shape[0])
    gen = sampler.generator(SampleRow(seq_id, params, output_ids), logits.device)
    return rejection_sample(p, draft.probs, d, gen)
