"""The DFlash drafter's forward against a plain-torch reimplementation of the published model
math (z-lab/dflash, arXiv 2602.06036), written here independently: the fused context
hidden_norm(fc(concat of the chosen target layers)) projected to K/V by every layer (no
input_layernorm on it), the block [token, masks] attending to the context and to itself
without a causal mask, q/k normed per head and roped at absolute positions, the target's
embedding in and LM head out. Batched rows with different context lengths (padding masked)
and a context computed in pieces must give the reference's logits."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from artifacts.fixture_dflash import dflash_config, random_state
from ninfer.artifact.dflash import DFlashConfig
from ninfer.spec.dflash_model import DFlashModel

TARGET = {  # a made-up target: 6 layers, GQA 4/2, head_dim 16
    "num_hidden_layers": 6, "hidden_size": 64, "intermediate_size": 96,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 600,
    "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
}  # fmt: skip


def _rms(x, w, eps=1e-6):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope(x, pos, theta):  # x [n, heads, d]
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    f = pos.double()[:, None] * inv[None]
    cos, sin = torch.cat([f, f], -1).cos()[:, None], torch.cat([f, f], -1).sin()[:, None]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def reference(cfg, W, embed, head, target_hidden, ctx_pos, block, block_pos):
    """Published math, float64, one sequence: logits [len(block) - 1, vocab]."""
    H, KV, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    theta = cfg["rope_theta"]
    W = {k: v.double() for k, v in W.items()}
    ctx = _rms(target_hidden.double() @ W["fc.weight"].T, W["hidden_norm.weight"])
    x = embed.double()[block]
    n, C = len(block), len(ctx_pos)
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}"
        h = _rms(x, W[f"{p}.input_layernorm.weight"])
        q = _rms(
            (h @ W[f"{p}.self_attn.q_proj.weight"].T).view(n, H, d),
            W[f"{p}.self_attn.q_norm.weight"],
        )
        kin = torch.cat([ctx, h])
        k = _rms(
            (kin @ W[f"{p}.self_attn.k_proj.weight"].T).view(C + n, KV, d),
            W[f"{p}.self_attn.k_norm.weight"],
        )
        v = (kin @ W[f"{p}.self_attn.v_proj.weight"].T).view(C + n, KV, d)
        q, k = _rope(q, block_pos, theta), _rope(k, torch.cat([ctx_pos, block_pos]), theta)
        o = torch.empty(n, H, d, dtype=torch.float64)
        for hh in range(H):
            g = hh // (H // KV)
            s = (q[:, hh] @ k[:, g].T) / math.sqrt(d)
            o[:, hh] = torch.softmax(s, -1) @ v[:, g]
        x = x + o.reshape(n, H * d) @ W[f"{p}.self_attn.o_proj.weight"].T
        h = _rms(x, W[f"{p}.post_attention_layernorm.weight"])
        x = (
            x
            + (F.silu(h @ W[f"{p}.mlp.gate_proj.weight"].T) * (h @ W[f"{p}.mlp.up_proj.weight"].T))
            @ W[f"{p}.mlp.down_proj.weight"].T
        )
    return _rms(x[1:], W["norm.weight"]) @ head.double().T


def test_block_logits_match_the_published_math():
    cfg = dflash_config(TARGET, layers=2, block_size=5, target_layer_ids=[1, 3, 4])
    W = random_state(cfg, seed=3, std=0.15)
    gen = torch.Generator().manual_seed(0)
    embed = torch.randn(600, 64, generator=gen)
    head = 0.2 * torch.randn(600, 64, generator=gen)
    model = DFlashModel(DFlashConfig.from_config(cfg, 6, 64), W, embed, head)
    mask = cfg["dflash_config"]["mask_token_id"]
    lengths = (11, 4)  # two rows, contexts of different lengths in one padded batch
    feats = [torch.randn(n, 3 * 64, generator=gen) for n in lengths]
    want, ks, vs = [], [], []
    for f, n in zip(feats, lengths):
        block = torch.tensor([17 + n] + [mask] * 4)
        want.append(
            reference(cfg, W, embed, head, f, torch.arange(n), block, torch.arange(n, n + 5))
        )
        # the context arrives in two pieces, as prefill and a round would hand it over
        a = model.context_kv(f[:3], torch.arange(3))
        b = model.context_kv(f[3:], torch.arange(3, n))
        ks.append([torch.cat([x[0], y[0]]) for x, y in zip(a, b)])
        vs.append([torch.cat([x[1], y[1]]) for x, y in zip(a, b)])
    C = max(lengths)
    ctx, valid = [], torch.zeros(2, C, dtype=torch.bool)
    for i in range(2):
        k = torch.zeros(2, C, 32)
        v = torch.zeros(2, C, 32)
        for r, n in enumerate(lengths):
            k[r, :n], v[r, :n] = ks[r][i], vs[r][i]
            v[r, n:] = 1e3  # padding must not leak into the attention
        ctx.append((k, v))
    for r, n in enumerate(lengths):
        valid[r, :n] = True
    tokens = torch.tensor([[17 + n] + [mask] * 4 for n in lengths])
    positions = torch.stack([torch.arange(n, n + 5) for n in lengths])
    got = model.block_logits(tokens, positions, ctx, valid)
    assert got.shape == (2, 4, 600)
    for r in range(2):
        torch.testing.assert_close(got[r].double(), want[r], rtol=1e-4, atol=1e-4)
    # the block is not causal: changing the last mask position changes the first draft
    t2 = tokens.clone()
    t2[:, -1] = 5
    assert not torch.allclose(model.block_logits(t2, positions, ctx, valid)[:, 0], got[:, 0])
