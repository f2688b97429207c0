"""`--spec dflash`: the DFlash drafter (ninfer/spec/dflash_model.py holds its forward).

The target's plan captures the residual stream after each layer of `target_layer_ids`
(CompileOptions.capture) for every position it computes; the speculator hands those rows to
`observe` after every step. The drafter turns them at once into its per-layer context K/V and
keeps them per sequence, with the token fed at each position::

    observe(batch, hidden)                per chunk of the step the target ran: its positions
                                          >= start are dropped (recomputed) and the new rows
                                          appended: prefill chunks, decode rows, verify chunks
                                          (drafts included)
    propose(rows)                         per row, held positions are valid while the token held
                                          equals the committed token there and the position is
                                          before the row's last token (the one the target
                                          computes next): rejected drafts, a forced thinking
                                          suffix and anything after them are discarded exactly,
                                          since a position's hidden state depends only on the
                                          tokens up to it; then ONE block forward for all rows:
                                          [last token, mask x (block - 1)] at positions
                                          len - 1 .., the first min(k, block - 1) masks drafted

Greedy rows take the argmax of each drafted position; sampled rows draw each draft from q, the
plain sampler's processing of that position's draft logits (penalties counting the drafts
before it), with the request's own generator, and return q for rejection sampling. A position
the target never computed (a prompt prefix served from the prefix cache) gives no context: the
drafts are worse, the output is unchanged (verification decides it).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ninfer.artifact.dflash import COMPONENT, dflash_config
from ninfer.errors import ConfigError
from ninfer.runtime.executors.sampler import Sampler, SampleRow
from ninfer.runtime.step import StepBatch
from ninfer.spec.dflash_model import DFlashModel, load_dflash
from ninfer.spec.drafter import NO_DRAFT, Draft, DraftRow, TimedDrafter
from ninfer.spec.verify import processed_logits


@dataclass
class _Context:
    """The context K/V of one sequence: rows [0, n) of a growable buffer `kv` [layers, 2 (K,
    V), capacity, kv_heads * head_dim] (one tensor: a graph round stages all of it at once)."""

    positions: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)  # the token fed at each position
    kv: torch.Tensor | None = None
    # rows [0, checked) matched the committed tokens once: committed tokens never change, so
    # they stay valid until observe() replaces them (a replay recomputes them)
    checked: int = 0
    # the graph path's staging (ninfer/spec/dflash_graph.py): the sequence's row there, and
    # how many of its rows that row holds as they are now
    slot: int | None = None
    synced: int = 0

    @property
    def n(self) -> int:
        return len(self.positions)

    @property
    def k(self) -> list[torch.Tensor]:
        """Per layer K [capacity, width] (views of `kv`)."""
        return [] if self.kv is None else list(self.kv[:, 0])

    @property
    def v(self) -> list[torch.Tensor]:
        return [] if self.kv is None else list(self.kv[:, 1])

    def truncate(self, n: int) -> None:
        del self.positions[n:], self.tokens[n:]
        self.checked = min(self.checked, n)
        self.synced = min(self.synced, n)  # a staged copy past n is stale from here on

    def append(self, positions: Sequence[int], tokens: Sequence[int], kv: list) -> None:
        """Add rows after the held ones; kv: per layer (K, V) [len(positions), width]."""
        n, m = self.n, len(positions)
        if self.kv is None or n + m > self.kv.shape[2]:  # grow by doubling: appends stay O(1)
            like = kv[0][0]
            buf = torch.empty(
                len(kv), 2, max(64, 2 * (n + m)), like.shape[-1], dtype=like.dtype,
                device=like.device,
            )  # fmt: skip
            if self.kv is not None and n:
                buf[:, :, :n] = self.kv[:, :, :n]
            self.kv = buf
        for i, (k, v) in enumerate(kv):
            self.kv[i, 0, n : n + m] = k
            self.kv[i, 1, n : n + m] = v
        self.positions.extend(positions)
        self.tokens.extend(tokens)


class DFlashDrafter(TimedDrafter):
    """Drafts a block per round with `model` from the target's captured hidden states."""

    name = "dflash"

    def __init__(self, model: DFlashModel, graphs: Any = None) -> None:
        """`graphs`: run rounds from CUDA Graphs (ninfer/spec/dflash_graph.py) where they fit;
        None: every round eagerly (the CPU path, --no-cuda-graph)."""
        self.model = model
        self.graphs = graphs
        self.capture = model.cfg.capture  # the capture names observe() needs, in fc's order
        self._ctx: dict[int, _Context] = {}
        self.steps = 0  # drafter forwards run (bench: drafter cost per round)
        self.seconds = 0.0  # wall time spent observing and proposing

    def forget(self, seq_id: int) -> None:
        ctx = self._ctx.pop(seq_id, None)
        if ctx is not None and self.graphs is not None:
            self.graphs.release(ctx)

    @torch.inference_mode()
    def observe(self, batch: StepBatch, hidden: Mapping[str, torch.Tensor]) -> None:
        """The target ran `batch`; `hidden[name]` [batch tokens, target_hidden]: its captured
        states, rows in chunk order (names: `capture`). Every chunk's rows become context."""
        t0 = time.perf_counter()
        feats = torch.cat([hidden[name] for name in self.capture], dim=-1)
        pos = torch.cat([
            torch.arange(c.start_pos, c.start_pos + len(c.token_ids)) for c in batch.chunks
        ]).to(self.model.device)  # fmt: skip
        kv = self.model.context_kv(feats, pos)
        begin = 0
        for c in batch.chunks:
            n = len(c.token_ids)
            ctx = self._ctx.setdefault(c.seq_id, _Context())
            ctx.truncate(bisect.bisect_left(ctx.positions, c.start_pos))
            rows = [(k[begin : begin + n], v[begin : begin + n]) for k, v in kv]
            ctx.append(range(c.start_pos, c.start_pos + n), c.token_ids, rows)
            begin += n
        self.seconds += time.perf_counter() - t0

    def _valid(self, row: DraftRow) -> _Context:
        """The row's context, cut to the positions still valid for its committed tokens."""
        ctx = self._ctx.setdefault(row.seq_id, _Context())
        last = len(row.tokens) - 1  # the token the target computes next: not context yet
        n = ctx.checked
        while (
            n < ctx.n and ctx.positions[n] < last and ctx.tokens[n] == row.tokens[ctx.positions[n]]
        ):
            n += 1
        ctx.truncate(n)
        ctx.checked = n
        return ctx

    @torch.inference_mode()
    def _propose(self, rows: Sequence[DraftRow], sampler: Sampler) -> list[Draft]:
        live = [i for i, r in enumerate(rows) if r.k > 0]
        if not live:
            return [NO_DRAFT] * len(rows)
        m = self.model
        block = m.cfg.block_size
        ctxs = [self._valid(rows[i]) for i in live]
        C = max(c.n for c in ctxs)
        drafts = min(max(rows[i].k for i in live), block - 1)  # the LM head runs on these only
        self.steps += 1
        out = [NO_DRAFT] * len(rows)
        if self.graphs is not None and self.graphs.fits(len(live), C):
            staged = [(c, c.kv, c.n, rows[i].tokens[-1], len(rows[i].tokens) - 1)
                      for c, i in zip(ctxs, live)]  # fmt: skip
            ids, logits = self.graphs.run(staged)
            greedy = [b for b, i in enumerate(live) if _plain_greedy(rows[i])]
            best = ids[: max(greedy) + 1].tolist() if greedy else []  # one sync for them all
            logits = logits.view(ids.shape[0], block, -1)
            for b, i in enumerate(live):
                k = min(rows[i].k, block - 1)
                if b in greedy:
                    out[i] = Draft(tuple(best[b][:k]))
                else:
                    out[i] = self._choose(m.full_logits(logits[b, 1 : 1 + k]), rows[i], sampler)
            return out
        layers = m.cfg.spec.layers
        width = m.cfg.spec.kv_heads * m.cfg.spec.head_dim
        B = len(live)
        ck = [torch.zeros(B, C, width, dtype=m.dtype, device=m.device) for _ in range(layers)]
        cv = [torch.zeros(B, C, width, dtype=m.dtype, device=m.device) for _ in range(layers)]
        valid = torch.zeros(B, C, dtype=torch.bool, device=m.device)
        for b, c in enumerate(ctxs):
            if c.n:
                for i in range(layers):
                    ck[i][b, : c.n] = c.kv[i, 0, : c.n]
                    cv[i][b, : c.n] = c.kv[i, 1, : c.n]
            valid[b, : c.n] = True
        tokens = torch.full((B, block), m.cfg.mask_token_id, dtype=torch.long, device=m.device)
        starts = torch.tensor([len(rows[i].tokens) - 1 for i in live], device=m.device)
        tokens[:, 0] = torch.tensor([rows[i].tokens[-1] for i in live], device=m.device)
        positions = starts[:, None] + torch.arange(block, device=m.device)[None, :]
        logits = m.block_logits(tokens, positions, list(zip(ck, cv)), valid, drafts)  # [B, d, V]
        for b, i in enumerate(live):
            out[i] = self._choose(logits[b, : min(rows[i].k, block - 1)], rows[i], sampler)
        return out

    def _choose(self, logits: torch.Tensor, row: DraftRow, sampler: Sampler) -> Draft:
        """Drafts from one row's block logits [n, vocab], position by position (module
        docstring)."""
        if _plain_greedy(row):  # one argmax per row
            return Draft(tuple(logits.argmax(dim=-1).tolist()))
        output = list(row.tokens[row.num_prompt :])
        drafts: list[int] = []
        probs = []
        gen = None
        for j in range(logits.shape[0]):
            x = processed_logits(logits[j : j + 1], row.seq_id, row.params, output + drafts, ())
            if row.params.greedy:
                drafts.append(int(x[0].argmax()))
                continue
            q = Sampler.probabilities(x, [row.params])[0]
            if gen is None:
                gen = sampler.generator(SampleRow(row.seq_id, row.params, output), logits.device)
            drafts.append(int(torch.multinomial(q, 1, generator=gen)))
            probs.append(q)
        return Draft(tuple(drafts), torch.stack(probs) if probs else None)


def _plain_greedy(row: DraftRow) -> bool:
    """Greedy without penalties: the drafts are the argmax of each position's raw logits."""
    p = row.params
    return p.greedy and not (p.presence_penalty or p.frequency_penalty)


def dflash_capture(artifact: Any) -> tuple[str, ...]:
    """The target hidden states `--spec dflash` needs the plan to capture ("L{i}" of the
    drafter's target_layer_ids; none when the artifact has no dflash component)."""
    if COMPONENT not in getattr(artifact, "components", ()):
        return ()
    return dflash_config(artifact).capture


def build_dflash_drafter(
    artifact: Any, executor: Any, lm_head_draft: bool = False
) -> DFlashDrafter:
    """The drafter of `artifact`'s dflash component for the target served by `executor`
    (whose plan captures `dflash_capture(artifact)`); `lm_head_draft`: its logits over the
    reduced, frequency-ranked head of ninfer/spec/draft_vocab.py. ConfigError when the
    artifact has no dflash component or the plan does not capture what it needs."""
    if COMPONENT not in getattr(artifact, "components", ()):
        have = ", ".join(getattr(artifact, "components", ())) or "none"
        raise ConfigError(
            f"--spec dflash needs the artifact's dflash component, but it has only {have}; drop"
            " --spec or attach a drafter (ninfer convert ARTIFACT --dflash DIR -o OUT)"
        )
    model = load_dflash(artifact, executor, executor.dtype)
    if lm_head_draft:
        from ninfer.spec.draft_vocab import build_draft_head

        model.reduce_head(build_draft_head(artifact, executor.dtype, model.device))
    captured = set((getattr(executor, "plan", None) and executor.plan.model.get("capture")) or ())
    missing = [c for c in model.cfg.capture if c not in captured]
    if missing:
        raise ConfigError(
            f"--spec dflash: the target plan does not capture {', '.join(missing)} (the"
            " drafter's target layers)"
        )
    graphs = None
    plan = getattr(executor, "plan", None)
    if model.device.type == "cuda" and (plan is None or plan.options.cuda_graphs):
        from ninfer.spec.dflash_graph import DFlashGraphs

        graphs = DFlashGraphs(model, fp8_layers=lm_head_draft)
    return DFlashDrafter(model, graphs)
