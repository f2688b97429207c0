"""Token bitmasks for a decode batch: filled on the host, applied to logits in the sampler.

Layout (llguidance's and xgrammar's): int32 [batch, ceil(vocab / 32)]; bit j of word w of a row
set means token 32·w + j is allowed. `BatchMasks.fill` computes the rows of the constrained
sequences of one step in parallel (llguidance's thread pool, outside the GIL); `apply_bitmask`
sets the logits of disallowed tokens to -inf with plain torch ops, so it runs wherever the
logits are (CPU, or CUDA after one host-to-device copy of the mask rows).
"""

from __future__ import annotations

from collections.abc import Sequence

import llguidance
import torch

from ninfer.constrain.matcher import Matcher
from ninfer.constrain.tokenizer_info import TokenizerInfo


class BatchMasks:
    """A reusable bitmask for up to `max_batch` rows, pinned when CUDA is present so the copy
    to the device can overlap. One per engine; `fill` is called once per step."""

    def __init__(self, info: TokenizerInfo, max_batch: int, threads: int | None = None) -> None:
        self.info = info
        pin = torch.cuda.is_available()
        self.bitmask = torch.full(
            (max_batch, info.mask_words), -1, dtype=torch.int32, pin_memory=pin
        )
        self._executor = llguidance.LLExecutor(threads)

    def fill(self, matchers: Sequence[Matcher | None]) -> list[int]:
        """Fill `bitmask[i]` for every row i whose matcher is not None; returns those rows (the
        rows `apply_bitmask` must mask). Rows of unconstrained sequences are left as they are."""
        if len(matchers) > self.bitmask.shape[0]:
            raise ValueError(f"batch of {len(matchers)} > {self.bitmask.shape[0]} mask rows")
        rows, engine_rows = [], []
        for i, m in enumerate(matchers):
            if m is None:
                continue
            rows.append(i)
            if m.gated:
                m.fill_mask(self.bitmask[i])
            else:
                engine_rows.append((m.engine, i))
        if engine_rows:
            words = self.info.mask_words
            self._executor.unsafe_compute_mask_ptr(
                engine_rows, self.bitmask.data_ptr(), words * 4, self.bitmask.shape[0]
            )
        return rows


def apply_bitmask(
    logits: torch.Tensor, bitmask: torch.Tensor, rows: Sequence[int] | None = None
) -> None:
    """In place: logits[r, t] = -inf for every token t whose bit is 0 in bitmask[r], for r in
    `rows` (every row when None). logits: [batch, vocab] float on any device; bitmask: int32
    [>= batch, ceil(vocab / 32)] on the host or on logits' device. Tokens beyond the mask's
    32·words columns are masked too."""
    if bitmask.dtype != torch.int32 or bitmask.dim() != 2 or logits.dim() != 2:
        raise ValueError("apply_bitmask takes logits [B, V] and an int32 bitmask [B, W]")
    vocab = logits.shape[1]
    index = None
    if rows is None:
        words = bitmask[: logits.shape[0]]
    else:
        if not rows:
            return
        index = torch.tensor(list(rows), dtype=torch.long)
        words = bitmask.index_select(0, index.to(bitmask.device))
    words = words.to(logits.device, non_blocking=True)
    shifts = torch.arange(32, dtype=torch.int32, device=logits.device)
    # allowed: [n, W, 32] -> [n, 32·W] -> first `vocab` columns
    allowed = ((words.unsqueeze(-1) >> shifts) & 1).bool().flatten(1)
    if allowed.shape[1] < vocab:
        allowed = torch.nn.functional.pad(allowed, (0, vocab - allowed.shape[1]), value=False)
    blocked = ~allowed[:, :vocab]
    if index is None:
        logits.masked_fill_(blocked, float("-inf"))
    else:
        index = index.to(logits.device)
        logits.index_copy_(
            0, index, logits.index_select(0, index).masked_fill_(blocked, float("-inf"))
        )
