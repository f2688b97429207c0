from __future__ import annotations

import pytest
import torch

from kernels.rotary import rope_inv_freq, rotary, rotary_, rotary_reference


def test_reference_matches_transformers_llama() -> None:
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    T, H, D = 5, 2, 16
    q, k = torch.randn(T, H, D), torch.randn(T, H, D)
    pos = torch.tensor([0, 3, 7, 100, 2049])
    inv = rope_inv_freq(D, 10000.0)
    freqs = pos.float()[:, None] * inv
    emb = torch.cat([freqs, freqs], -1)
    # HF works on [B, H, T, D]
    qh, kh = apply_rotary_pos_emb(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], emb.cos()[None], emb.sin()[None]
    )
    torch.testing.assert_close(rotary_reference(q, pos, inv), qh[0].transpose(0, 1))
    torch.testing.assert_close(rotary_reference(k, pos, inv), kh[0].transpose(0, 1))


def _qwen3_5_rotary(head_dim: int, factor: float, section: list[int]):
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextRotaryEmbedding

    cfg = Qwen3_5TextConfig(
        hidden_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=head_dim,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": factor,
            "mrope_section": section,
            "mrope_interleaved": True,
        },
    )
    return Qwen3_5TextRotaryEmbedding(cfg)


def test_reference_matches_transformers_qwen3_5_mrope() -> None:
    from transformers.models.qwen3_5.modeling_qwen3_5 import apply_rotary_pos_emb

    head_dim, factor, section = 64, 0.5, [6, 5, 5]  # rotary_dim 32, 16 frequencies
    emb = _qwen3_5_rotary(head_dim, factor, section)
    T = 6
    pos3 = torch.stack([torch.arange(T), torch.arange(T) * 2 + 1, torch.arange(T) * 5 + 3])
    q = torch.randn(T, 2, head_dim)
    cos, sin = emb(q[None], pos3[:, None, :])  # [1, T, rot]
    qh, _ = apply_rotary_pos_emb(q.transpose(0, 1)[None], q.transpose(0, 1)[None], cos, sin)
    ref = rotary_reference(q, pos3, emb.inv_freq, mrope_section=section)
    torch.testing.assert_close(ref, qh[0].transpose(0, 1), rtol=1e-5, atol=1e-5)
    # equal axes reduce to plain rotary
    same = pos3[:1].expand(3, T).contiguous()
    torch.testing.assert_close(
        rotary_reference(q, same, emb.inv_freq, mrope_section=section),
        rotary_reference(q, same[0], emb.inv_freq),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rotary_dim", [32, 16])
def test_rotary_matches_reference(device, dtype, rotary_dim) -> None:
    T, Hq, Hk, D = 5, 4, 2, 32
    q = torch.randn(T, Hq, D, device=device, dtype=dtype)
    k = torch.randn(T, Hk, D, device=device, dtype=dtype)
    pos = torch.tensor([0, 1, 17, 4000, 131071], device=device)
    inv = rope_inv_freq(rotary_dim, 1e6, device)
    q_ref, k_ref = rotary_reference(q, pos, inv), rotary_reference(k, pos, inv)
    q2, k2 = rotary(q, k, pos, rotary_dim=rotary_dim, theta=1e6)
    assert q2.data_ptr() == q.data_ptr() and k2.data_ptr() == k.data_ptr()  # in place
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(q, q_ref, rtol=tol, atol=tol)
    torch.testing.assert_close(k, k_ref, rtol=tol, atol=tol)


def test_rotary_on_strided_view_of_fused_qkv(device) -> None:
    T, H, D = 3, 2, 16
    qkv = torch.randn(T, 3 * H * D, device=device)
    before = qkv.clone()
    q = qkv[:, : H * D].view(T, H, D)
    pos = torch.tensor([5, 6, 7], device=device)
    inv = rope_inv_freq(D, 10000.0, device)
    ref = rotary_reference(q, pos, inv)
    rotary_(q, pos, inv)
    torch.testing.assert_close(qkv[:, : H * D].view(T, H, D), ref, rtol=2e-5, atol=2e-5)
    assert torch.equal(qkv[:, H * D :], before[:, H * D :])  # k, v untouched


def test_mrope_matches_reference(device) -> None:
    T, H, D = 4, 3, 64
    section = [11, 11, 10]  # Qwen3.5: rotary_dim 64 of head_dim 64 here
    x = torch.randn(T, H, D, device=device)
    pos3 = torch.randint(0, 5000, (3, T), device=device)
    inv = rope_inv_freq(64, 1e7, device)
    ref = rotary_reference(x, pos3, inv, mrope_section=section)
    rotary_(x, pos3, inv, mrope_section=section)
    torch.testing.assert_close(x, ref, rtol=2e-5, atol=2e-5)


@pytest.mark.gpu
def test_rotary_large_positions(device) -> None:
    T, H, D = 4096, 32, 128
    q = torch.randn(T, H, D, device=device)
    pos = torch.randint(0, 1 << 20, (T,), device=device)
    inv = rope_inv_freq(D, 5e5, device)
    ref = rotary_reference(q, pos, inv)
    rotary_(q, pos, inv)
    torch.testing.assert_close(q, ref, rtol=1e-4, atol=1e-4)


def test_reference_scale_matches_transformers_yarn() -> None:
    """YaRN: transformers multiplies cos and sin by attention_factor; `scale` is that factor."""
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding, apply_rotary_pos_emb

    D = 32
    cfg = Qwen3Config(
        hidden_size=64,
        num_attention_heads=2,
        head_dim=D,
        max_position_embeddings=128,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 1e6,
            "factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    )
    emb = Qwen3RotaryEmbedding(cfg)
    assert emb.attention_scaling > 1.1
    T = 5
    pos = torch.tensor([0, 3, 31, 60, 127])
    q = torch.randn(T, 2, D)
    cos, sin = emb(q[None], pos[None])  # [1, T, D], already scaled
    qh, _ = apply_rotary_pos_emb(q.transpose(0, 1)[None], q.transpose(0, 1)[None], cos, sin)
    ref = rotary_reference(q, pos, emb.inv_freq, scale=emb.attention_scaling)
    torch.testing.assert_close(ref, qh[0].transpose(0, 1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_scale_matches_reference(device, dtype) -> None:
    T, Hq, Hk, D, scale = 4, 3, 1, 32, 1.1386
    q = torch.randn(T, Hq, D, device=device, dtype=dtype)
    k = torch.randn(T, Hk, D, device=device, dtype=dtype)
    pos = torch.tensor([0, 5, 33, 4000], device=device)
    inv = rope_inv_freq(D, 1e6, device)
    q_ref, k_ref = (
        rotary_reference(q, pos, inv, scale=scale),
        rotary_reference(k, pos, inv, scale=scale),
    )
    assert not torch.allclose(q_ref, rotary_reference(q, pos, inv), atol=1e-3)  # scale matters
    rotary(q, k, pos, inv_freq=inv, scale=scale)
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(q, q_ref, rtol=tol, atol=tol)
    torch.testing.assert_close(k, k_ref, rtol=tol, atol=tol)
