"""`--lm-head-draft`: a reduced, frequency-ranked draft head (FR-Spec, arXiv 2502.14856).

The drafter's logits use only the N most frequent tokens' rows of the lm_head, so its LM head
costs N/vocab of the full one; verification stays with the target's full head, so output is
unchanged (a token outside the subset is simply never drafted; q is zero there, which keeps
rejection sampling exact).

    N        min(32768, ceil(vocab / 4)): 32k as FR-Spec uses for a 128k-152k vocabulary, a quarter
             of a small one (the tiny fixtures' 512 -> 128)
    ranking  the artifact's own `mtp.draft_vocab` (token ids, most frequent first) when the
             component carries one: artifacts/train_mtp.py writes the token counts of the
             target's greedy continuations of its training corpus; otherwise the tokenizer's:
             a BPE learns its merges in order of pair frequency over its training corpus, so
             the tokens made by merge 0, 1, 2, ... come first, then the rest by id.
    always   the tokenizer's added / special tokens (EOS, </think>, tool-call markers):
             a drafter must be able to propose a stop

`build_draft_head` gives the head as a `DraftHead` (ninfer/spec/draft_head.py: fp8 rows on CUDA,
the model dtype elsewhere); `draft_head` the (ids, rows) pair in the model dtype.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch

from ninfer.spec.draft_head import DraftHead

RANKING = "mtp.draft_vocab"
MAX_DRAFT_VOCAB = 32768


def draft_size(vocab: int) -> int:
    """N, the rows of the reduced head (module docstring)."""
    return min(MAX_DRAFT_VOCAB, -(-vocab // 4))


def tokenizer_ranking(tokenizer_json: str, vocab: int) -> list[int]:
    """Token ids by BPE merge order (the tokenizer corpus' pair frequency), then by id."""
    model = json.loads(tokenizer_json).get("model", {}) if tokenizer_json else {}
    ids = model.get("vocab") or {}
    ranked: list[int] = []
    for merge in model.get("merges") or []:
        a, b = merge.split(" ", 1) if isinstance(merge, str) else merge
        t = ids.get(a + b)
        if t is not None and t < vocab:
            ranked.append(t)
    return ranked + list(range(vocab))  # duplicates dropped by the caller


def draft_vocab(artifact: Any, vocab: int, n: int | None = None) -> list[int]:
    """The reduced head's token ids, ascending: the special tokens, then the top of the
    ranking (module docstring) up to `n` (default draft_size) ids in all."""
    n = draft_size(vocab) if n is None else n
    tok = artifact.tokenizer_json
    special = {t["id"] for t in json.loads(tok).get("added_tokens", [])} if tok else set()
    eos = (artifact.special_tokens or {}).get("eos_token_ids") or []
    keep = {t for t in (*special, *eos) if 0 <= t < vocab}
    if RANKING in artifact:
        ranking = [int(t) for t in np.asarray(artifact.dense(RANKING)).reshape(-1)]
    else:
        ranking = tokenizer_ranking(tok, vocab)
    for t in ranking:
        if len(keep) >= n:
            break
        if 0 <= t < vocab:
            keep.add(t)
    return sorted(keep)


def _head_rows(artifact: Any, n: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [N] int64, the lm_head's rows of those ids [N, hidden] fp32), on the CPU."""
    from ninfer.artifact.model_spec import model_spec
    from ninfer.ir.models.mtp import lm_head

    spec = model_spec(artifact.architecture, artifact.config)
    ids = draft_vocab(artifact, spec.vocab, n)
    head = np.asarray(artifact.dense(lm_head(spec, lambda t: t in artifact)), dtype=np.float32)
    return torch.tensor(ids, dtype=torch.long), torch.from_numpy(head[ids].copy())


def draft_head(
    artifact: Any, dtype: torch.dtype, device: torch.device, n: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [N] int64, the lm_head's rows of those ids [N, hidden]) of `artifact`."""
    index, rows = _head_rows(artifact, n)
    return index.to(device), rows.to(device=device, dtype=dtype)


def build_draft_head(
    artifact: Any,
    dtype: torch.dtype,
    device: torch.device,
    n: int | None = None,
    fp8: bool | None = None,
) -> DraftHead:
    """`artifact`'s reduced head as a DraftHead (ninfer/spec/draft_head.py: fp8 rows on CUDA
    unless `fp8` is False; the rows quantised from their fp32 values), logits in `dtype`."""
    index, rows = _head_rows(artifact, n)
    return DraftHead(index, rows, dtype=dtype, device=device, fp8=fp8)
