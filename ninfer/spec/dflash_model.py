"""The DFlash drafter's forward (arXiv 2602.06036): a few Qwen3-style layers that draft a whole
block of tokens in one non-causal forward, conditioned on the target's hidden states.

Published checkpoint layout (e.g. z-lab/Qwen3-8B-DFlash-b16), stored in the artifact under a
`dflash.` prefix (ninfer/artifact/dflash.py) with its config.json as header["dflash"]:

    fc.weight                     [hidden, len(target_layer_ids) * target_hidden]
    hidden_norm.weight            [hidden]        RMSNorm of the fused context
    layers.N.input_layernorm, self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm (per head),
    layers.N.post_attention_layernorm, mlp.{gate,up,down}_proj      (Qwen3 layers)
    norm.weight                   [hidden]        before the target's LM head
    config: block_size, dflash_config.target_layer_ids, dflash_config.mask_token_id

The target's token embedding and LM head are shared (the drafter has none). The math::

    ctx_p   = hidden_norm(fc(concat_l h_l[p]))        h_l: the target's residual stream after
                                                      layer l (l in target_layer_ids), position p
    per layer i, context K/V (kept per sequence, computed once per target position):
        K_i[p] = rope(k_norm(k_proj_i(ctx_p)), p)     V_i[p] = v_proj_i(ctx_p)
    block at positions s .. s+B-1 = [last committed token, mask x (B-1)]:
        x = embed(block)
        per layer: h = input_layernorm(x); q, k, v of h (q/k normed per head, roped at their
                   positions); attention of the B queries over context K/V of every position
                   < s and the block's own B keys, NOT causal (every block position sees all);
                   x += o_proj(attn); x += mlp(post_attention_layernorm(x))
        logits of block position j (1..B-1) = lm_head(norm(x[j])): the draft for s + j

Context positions are not normed by input_layernorm: the fused context goes straight into each
layer's k/v projections, as the published model computes it.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F

from ninfer.artifact.dflash import DFlashConfig, dflash_config, drafter_tensors
from ninfer.artifact.format import Artifact
from ninfer.artifact.model_spec import model_spec
from ninfer.errors import ArtifactError
from ninfer.runtime.executors.cpu.ops import _inv_freq, rope_scale, rotate_half
from ninfer.spec.draft_head import DraftHead


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class DFlashModel:
    """The drafter's weights and forward. `weights`: the published names (no prefix) in the
    compute dtype; `embed` [vocab, target_hidden] and `head` [vocab, hidden]: the target's."""

    def __init__(
        self,
        cfg: DFlashConfig,
        weights: Mapping[str, torch.Tensor],
        embed: torch.Tensor,
        head: torch.Tensor,
    ) -> None:
        s = cfg.spec
        if embed.shape[-1] != s.hidden or head.shape[-1] != s.hidden:
            raise ArtifactError(
                f"dflash: the drafter's hidden size {s.hidden} differs from the target's"
                f" embedding / LM head ({embed.shape[-1]})"
            )
        self.cfg = cfg
        self.w = dict(weights)
        self.embed, self.head = embed, head
        self.dtype = embed.dtype
        self.device = embed.device
        self._inv = _inv_freq(s.rope, s.rotary_dim).to(self.device)
        self._scale = rope_scale(s.rope)
        self.draft_ids: torch.Tensor | None = None  # --lm-head-draft: the reduced head's ids
        self.draft_head: DraftHead | None = None  # and its rows (ninfer/spec/draft_head.py)

    def reduce_head(self, head: DraftHead) -> None:
        """--lm-head-draft (FR-Spec): draft logits from the reduced head's LM head rows only
        (token ids head.ids [N]); every other token gets -inf, so it is never drafted and q is
        zero there (verification still uses the target's full head)."""
        self.draft_ids, self.draft_head = head.ids, head

    # -- pieces --------------------------------------------------------------------------
    def _rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """x [..., n, heads*head_dim] at positions pos [..., n] (rotate-half, as the target)."""
        s = self.cfg.spec
        freqs = pos.expand(x.shape[:-1]).float()[..., None] * self._inv  # [..., n, rd/2]
        emb = torch.cat([freqs, freqs], dim=-1)
        cos = (emb.cos() * self._scale).to(x.dtype)[..., None, :]
        sin = (emb.sin() * self._scale).to(x.dtype)[..., None, :]
        flat = x.reshape(-1, x.shape[-1])
        out = rotate_half(
            flat, cos.reshape(-1, 1, cos.shape[-1]), sin.reshape(-1, 1, sin.shape[-1]),
            s.head_dim, s.rotary_dim,
        )  # fmt: skip
        return out.reshape(x.shape)

    def _heads_norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        d = self.cfg.spec.head_dim
        return _rms(x.unflatten(-1, (-1, d)), w, self.cfg.spec.eps).flatten(-2)

    def fuse(self, hidden: torch.Tensor) -> torch.Tensor:
        """[n, len(ids) * target_hidden] (the chosen layers' states, concatenated in
        target_layer_ids order) -> the fused context [n, hidden]."""
        x = F.linear(hidden.to(self.dtype), self.w["fc.weight"])
        return _rms(x, self.w["hidden_norm.weight"], self.cfg.spec.eps)

    def context_kv(
        self, hidden: torch.Tensor, positions: torch.Tensor
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per draft layer (K, V) [n, kv_heads * head_dim] of context positions `positions` [n]
        whose chosen target states are `hidden` (see `fuse`); K roped."""
        ctx = self.fuse(hidden)
        out = []
        for i in range(self.cfg.spec.layers):
            p = f"layers.{i}.self_attn"
            k = self._heads_norm(
                F.linear(ctx, self.w[f"{p}.k_proj.weight"]), self.w[f"{p}.k_norm.weight"]
            )
            out.append((self._rope(k, positions), F.linear(ctx, self.w[f"{p}.v_proj.weight"])))
        return out

    def block_logits(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        ctx: list[tuple[torch.Tensor, torch.Tensor]],
        ctx_valid: torch.Tensor,
        rows: int | None = None,
    ) -> torch.Tensor:
        """Draft logits [B, rows, vocab] fp32 (default rows: block - 1) for blocks `tokens`
        [B, block] (the last committed token, then masks) at `positions` [B, block], over
        per-layer context (K, V) [B, C, kv_heads * head_dim] of which `ctx_valid` [B, C] marks
        the real rows. The whole block runs (its positions attend to each other); only the
        first `rows` drafts go through the LM head."""
        B, n = tokens.shape
        keep = torch.cat([ctx_valid, ctx_valid.new_ones(B, n)], dim=1)[:, None, None, :]
        x = self.forward(tokens, positions, ctx, keep)[:, 1 : 1 + (n - 1 if rows is None else rows)]
        head = self.draft_head
        return self.full_logits(F.linear(x, self.head) if head is None else head.logits(x))

    def full_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """fp32 logits [..., vocab] of the head's output [..., rows of the head]: --lm-head-draft
        gives -inf to every token outside the reduced head (reduce_head)."""
        if self.draft_head is None:
            return logits.float()
        full = torch.full(
            (*logits.shape[:-1], self.head.shape[0]), float("-inf"), device=logits.device
        )
        full[..., self.draft_ids] = logits.float()
        return full

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        ctx: list[tuple[torch.Tensor, torch.Tensor]],
        keep: torch.Tensor,
    ) -> torch.Tensor:
        """The normed output [B, n, hidden] of `tokens` [B, n] at `positions` over per-layer
        context (K, V) [B, C, kv width]; `keep` [B, 1, n, C + n] bool: which context and
        token keys each query attends to (block_logits: all valid context and its whole
        block; training packs many blocks into one row with their own masks)."""
        s = self.cfg.spec
        x = F.embedding(tokens.long(), self.embed)  # [B, n, hidden]
        rep = s.heads // s.kv_heads
        for i in range(s.layers):
            p = f"layers.{i}"
            w = self.w
            h = _rms(x, w[f"{p}.input_layernorm.weight"], s.eps)
            q = self._heads_norm(
                F.linear(h, w[f"{p}.self_attn.q_proj.weight"]), w[f"{p}.self_attn.q_norm.weight"]
            )
            k = self._heads_norm(
                F.linear(h, w[f"{p}.self_attn.k_proj.weight"]), w[f"{p}.self_attn.k_norm.weight"]
            )
            v = F.linear(h, w[f"{p}.self_attn.v_proj.weight"])
            q, k = self._rope(q, positions), self._rope(k, positions)
            k = torch.cat([ctx[i][0], k], dim=1).unflatten(-1, (s.kv_heads, s.head_dim))
            v = torch.cat([ctx[i][1], v], dim=1).unflatten(-1, (s.kv_heads, s.head_dim))
            k = k.transpose(1, 2).repeat_interleave(rep, dim=1)  # [B, heads, C + n, d]
            v = v.transpose(1, 2).repeat_interleave(rep, dim=1)
            q = q.unflatten(-1, (s.heads, s.head_dim)).transpose(1, 2)  # [B, heads, n, d]
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=s.head_dim**-0.5)
            x = x + F.linear(o.transpose(1, 2).flatten(-2), w[f"{p}.self_attn.o_proj.weight"])
            h = _rms(x, w[f"{p}.post_attention_layernorm.weight"], s.eps)
            act = F.silu(F.linear(h, w[f"{p}.mlp.gate_proj.weight"])) * F.linear(
                h, w[f"{p}.mlp.up_proj.weight"]
            )
            x = x + F.linear(act, w[f"{p}.mlp.down_proj.weight"])
        return _rms(x, self.w["norm.weight"], s.eps)


def _shared(executor: object, artifact: Artifact, name: str, dtype: torch.dtype) -> torch.Tensor:
    """A target weight the drafter shares: the executor's own tensor when it holds it plain,
    else read (dequantised) from the artifact."""
    w = getattr(executor, "weights", {}).get(name)
    if isinstance(w, torch.Tensor) and w.dim() == 2:
        return w
    return torch.from_numpy(artifact.dense(name).copy()).to(_device(executor), dtype)


def _device(executor: object) -> torch.device:
    """Where the target computes (the drafter runs beside it)."""
    return torch.device(getattr(executor, "device", "cpu"))


def load_dflash(artifact: Artifact, executor: object, dtype: torch.dtype) -> DFlashModel:
    """The drafter of `artifact`'s dflash component, in `dtype` on the target's device, sharing
    the target's token embedding and LM head (those `executor` loaded when it holds them as
    plain tensors)."""
    cfg = dflash_config(artifact)
    names = drafter_tensors(artifact)
    device = _device(executor)
    weights = {
        n: torch.from_numpy(artifact.dense(t).copy()).to(device, dtype) for n, t in names.items()
    }
    embed = _shared(executor, artifact, "model.embed_tokens.weight", dtype)
    tied = model_spec(artifact.architecture, artifact.config).tie_embeddings
    head_name = (  # the head the target's plan reads (ninfer/ir/models/decoder.py)
        "model.embed_tokens.weight"
        if tied or "lm_head.weight" not in artifact
        else "lm_head.weight"
    )
    head = _shared(executor, artifact, head_name, dtype)
    return DFlashModel(cfg, weights, embed, head)
