from __future__ import annotations

import json

import pytest
import torch

from kernels import nvfp4_gemv as mod
from kernels.compile_check import run_fresh
from kernels.nvfp4_gemv import (
    Nvfp4GemvConfig,
    load_table,
    nvfp4_gemv,
    nvfp4_gemv_reference,
    swiglu_out_ok,
)
from kernels.quant_decode import E2M1_VALUES, decode_fp8
from kernels.quant_gemm import dequantize_weight, quantize_weight_nvfp4

# e4m3 scale bytes of several magnitudes: subnormals (2^-9, 7 * 2^-9), 2^-6, 1, 1.75, 2^6, 448
SCALE_BYTES = [0x01, 0x07, 0x08, 0x38, 0x3E, 0x68, 0x7E]


def _weight(N: int, K: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed bytes [N, K/2] with every e2m1 code in every row (random bytes), and scale bytes
    [N, K/16] drawn from SCALE_BYTES."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randint(0, 256, (N, K // 2), generator=g, dtype=torch.uint8)
    w[:, :8] = torch.arange(0, 256, 32, dtype=torch.uint8) + torch.arange(8, dtype=torch.uint8)
    pick = torch.randint(0, len(SCALE_BYTES), (N, K // 16), generator=g)
    return w, torch.tensor(SCALE_BYTES, dtype=torch.uint8)[pick]


def _x(M: int, K: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(M, K, generator=g).to(dtype)


def _check(y: torch.Tensor, x, w, s, gs) -> None:
    """y against the dequantised weight times x in float64: fp32-accumulation tolerance (fp32
    y), one bf16 rounding (bf16 y)."""
    ref = x.double() @ dequantize_weight(w, s, "nvfp4", gs).double().t()
    scale = ref.abs().max().item()
    if y.dtype == torch.float32:
        torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5 * scale)
    else:
        torch.testing.assert_close(y.double(), ref, rtol=1e-2, atol=1e-2 * scale)


@pytest.mark.parametrize("M", [1, 2, 3, 4])
@pytest.mark.parametrize(
    "cfg,N,K",
    [
        (Nvfp4GemvConfig(4, 1, 1), 8, 1024),  # even: K a multiple of the chunk, N of BN
        (Nvfp4GemvConfig(2, 1, 2, mma=True), 13, 1040),  # ragged N, K % 16 == 0 only
        (Nvfp4GemvConfig(8, 1, 2), 11, 2096),
        (Nvfp4GemvConfig(1, 2, 1), 3, 272),
    ],
)
def test_matches_dequantised_matmul(device, M, cfg, N, K) -> None:
    """fp32 x, scalar global scale: only fp32 accumulation order differs."""
    w, s = _weight(N, K, seed=N * K)
    x = _x(M, K, torch.float32, seed=M)
    y = nvfp4_gemv(x.to(device), w.to(device), s.to(device), 0.37, cfg)
    assert y.shape == (M, N) and y.dtype == torch.float32
    _check(y.cpu(), x, w, s, 0.37)


@pytest.mark.parametrize("cfg", [Nvfp4GemvConfig(4, 1, 1), Nvfp4GemvConfig(4, 1, 2, mma=True)])
def test_bf16_x_and_row_global_scale(device, cfg) -> None:
    """bf16 x (read as bf16 pairs), a per-row [N] global scale, float8 scale dtype, and x rows
    that are views of a wider buffer."""
    N, K, M = 12, 1056, 3
    w, s = _weight(N, K, seed=5)
    gs = torch.linspace(0.1, 3.0, N)
    x = _x(M, K + 32, torch.bfloat16, seed=6)[:, :K]
    y = nvfp4_gemv(
        x.to(device), w.to(device), s.view(torch.float8_e4m3fn).to(device), gs.to(device), cfg
    )
    assert y.dtype == torch.bfloat16
    _check(y.cpu(), x.float(), w, s, gs)


@pytest.mark.parametrize("M", [1, 3])
@pytest.mark.parametrize(
    "cfg,dtype",
    [
        (Nvfp4GemvConfig(4, 1, 1), torch.float32),  # FMA variant, EVEN
        (Nvfp4GemvConfig(8, 1, 2), torch.bfloat16),
        (Nvfp4GemvConfig(4, 1, 2, mma=True), torch.bfloat16),  # tensor cores on CUDA
    ],
)
def test_swiglu_out(device, M, cfg, dtype) -> None:
    """W = [gate; up]: silu(gate) * up [M, N/2] from one launch equals the GEMV's output through
    the activation, gate and up rounded to x's dtype first (per-row global scale: each row's own)."""
    N, K = 24, 1056
    w, s = _weight(N, K, seed=9)
    gs = torch.linspace(0.2, 2.0, N)
    x = _x(M, K, dtype, seed=M).to(device)
    w, s, gs = w.to(device), s.to(device), gs.to(device)
    y = nvfp4_gemv(x, w, s, gs, cfg, swiglu_out=True)
    assert y.shape == (M, N // 2) and y.dtype == dtype
    gu = nvfp4_gemv(x, w, s, gs, cfg).float()
    g, u = gu[:, : N // 2], gu[:, N // 2 :]
    want = (g * torch.sigmoid(g) * u).to(dtype)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(
        y.float(), want.float(), rtol=tol, atol=tol * float(want.abs().max())
    )
    with pytest.raises(ValueError, match="swiglu_out needs"):
        nvfp4_gemv(x, w[:20], s[:20], 1.0, Nvfp4GemvConfig(8, 1, 1), swiglu_out=True)


def test_every_code_and_scale_exact(device) -> None:
    """One-hot x rows read single weights: y[k, n] = W[n, k] exactly, for all 16 codes (both
    nibbles of all 256 bytes) under every scale magnitude of SCALE_BYTES (subnormals too)."""
    N, K = len(SCALE_BYTES), 512  # row n: bytes 0..255 under scale SCALE_BYTES[n]
    w = torch.arange(256, dtype=torch.uint8).repeat(N, 1)
    s = torch.tensor(SCALE_BYTES, dtype=torch.uint8)[:, None].repeat(1, K // 16)
    ks = torch.arange(0, K, 3)  # 171 one-hot rows, odd and even k (high and low nibbles)
    x = torch.eye(K)[ks]
    y = nvfp4_gemv(x.to(device), w.to(device), s.to(device), 2.0, Nvfp4GemvConfig(4, 1, 1))
    # independent of dequantize_weight: the e2m1 table times the e4m3 scale times 2
    vals = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES))
    nibble = ((ks // 2) >> (4 * (ks % 2))) & 0xF
    want = vals[nibble][:, None] * decode_fp8(torch.tensor(SCALE_BYTES, dtype=torch.uint8)) * 2
    assert set(nibble.tolist()) == set(range(16))
    torch.testing.assert_close(y.cpu(), want, rtol=0, atol=0)


def test_quantised_weight(device) -> None:
    """A real quantised weight (quantize_weight_nvfp4), default config for M = 1."""
    wf = torch.randn(20, 768)
    q, s, g = quantize_weight_nvfp4(wf)
    x = _x(1, 768, torch.float32, seed=1)
    y = nvfp4_gemv(x.to(device), q.to(device), s.to(device), g)
    _check(y.cpu(), x, q, s, g)
    torch.testing.assert_close(
        y.cpu(), nvfp4_gemv_reference(x, q, s, g), rtol=1e-5, atol=1e-5 * float(y.abs().max())
    )


def test_rejects_bad_shapes(device) -> None:
    w, s = _weight(4, 64, seed=0)
    with pytest.raises(ValueError, match="K % 16"):
        nvfp4_gemv(torch.randn(1, 56), w[:, :28], s[:, :3])
    with pytest.raises(ValueError, match="1 or N"):
        nvfp4_gemv(torch.randn(1, 64), w, s, torch.ones(3))
    with pytest.raises(ValueError, match="bad Nvfp4GemvConfig"):
        Nvfp4GemvConfig(1, 4, 1, mma=True)


def test_table_round_trip(tmp_path) -> None:
    p = tmp_path / "t.json"
    p.write_text('{"4096:12288": {"1": [4, 4, 2, 1], "4": [8, 8, 1, 0]}, "6144:4096": {}}')
    t = load_table(p)
    assert t[(4096, 12288, 1)] == Nvfp4GemvConfig(4, 4, 2, True)
    assert t[(4096, 12288, 4)].bk == 32 * 32 * 8
    assert (6144, 4096, 1) not in t and (6144, 4096, 0) in t


def test_config_choice(monkeypatch) -> None:
    """Measured weights follow the table per batch bucket (no entry: the older path); others
    take the defaults (the interpreter's under the interpreter)."""
    table = {
        (64, 32, 0): None,
        (64, 32, 1): Nvfp4GemvConfig(2, 4, 1),
        (64, 32, 4): Nvfp4GemvConfig(4, 8, 1, True),
        (96, 32, 0): None,
    }
    monkeypatch.setattr(mod, "TABLE", table)
    assert mod.nvfp4_gemv_config(64, 32, 1) == Nvfp4GemvConfig(2, 4, 1)
    assert mod.nvfp4_gemv_config(64, 32, 2) is None
    assert mod.nvfp4_gemv_config(64, 32, 3) == Nvfp4GemvConfig(4, 8, 1, True)
    assert mod.nvfp4_gemv_config(64, 32, 5) is None
    assert mod.nvfp4_gemv_config(96, 32, 1) is None
    m1 = mod.INTERPRETED if mod.interpreting() else mod.DEFAULT_M1
    multi = mod.INTERPRETED if mod.interpreting() else mod.DEFAULT_MULTI
    assert mod.nvfp4_gemv_config(128, 32, 1) == m1
    assert mod.nvfp4_gemv_config(128, 32, 4) == multi


@pytest.mark.gpu
@pytest.mark.parametrize("mma", [False, True])
@pytest.mark.parametrize("NK", [(6144, 4096), (4096, 12288), (12352, 4096)])
def test_real_shapes_gpu(device, mma, NK) -> None:
    """Model shapes, bf16 x, every launch shape of the benchmark's sweep for one variant."""
    N, K = NK
    w, s = _weight(N, K, seed=0)
    w, s = w.to(device), s.to(device)
    x = _x(4, K, torch.bfloat16, seed=1).to(device)
    ref = x.float() @ dequantize_weight(w, s, "nvfp4", 0.01).t()
    for bn in (2, 4, 8):
        for warps in (2, 4, 8):
            for unroll in (1, 2):
                cfg = Nvfp4GemvConfig(bn, warps, unroll, mma)
                for m in (1, 2, 4):
                    y = nvfp4_gemv(x[:m], w, s, 0.01, cfg).float()
                    err = ((y - ref[:m]).abs().max() / ref[:m].abs().max()).item()
                    assert err < 1e-2, (cfg, m, err)


@pytest.mark.gpu
def test_table_launch_shapes_gpu(device) -> None:
    """Every launch shape kernels/nvfp4_gemv_table.json picks, at its own weight shape and batch
    bucket, against the dequantised matmul; for the gate/up weight also through its SwiGLU
    epilogue (what the decode step runs)."""
    picked = [(key, cfg) for key, cfg in mod.TABLE.items() if cfg is not None]
    assert picked
    for (N, K, M), cfg in picked:
        w, s = _weight(N, K, seed=N + K)
        w, s = w.to(device), s.to(device)
        x = _x(M, K, torch.bfloat16, seed=M).to(device)
        ref = x.float() @ dequantize_weight(w, s, "nvfp4", 0.01).t()
        y = nvfp4_gemv(x, w, s, 0.01, cfg).float()
        err = ((y - ref).abs().max() / ref.abs().max()).item()
        assert err < 1e-2, (N, K, M, cfg, err)
        if N == 24576 and swiglu_out_ok(N, cfg):
            g, u = ref.to(torch.bfloat16).float().chunk(2, dim=1)
            want = g * torch.sigmoid(g) * u
            got = nvfp4_gemv(x, w, s, 0.01, cfg, swiglu_out=True).float()
            err = ((got - want).abs().max() / want.abs().max()).item()
            assert err < 2e-2, (N, K, M, cfg, "swiglu", err)


_COMPILE_CHECK = """
import json
from kernels.compile_check import loop_stats, resource_usage
from kernels.nvfp4_gemv import Nvfp4GemvConfig, compile_nvfp4_gemv
out = []
for cfg, bm, swiglu in [((4, 2, 1, True), 1, False), ((8, 2, 1, True), 4, True)]:
    k = compile_nvfp4_gemv(Nvfp4GemvConfig(*cfg), bm=bm, even=True, swiglu_out=swiglu)
    out.append(loop_stats(k.asm["ptx"])._asdict() | {"regs": resource_usage(k).get("REG")})
print(json.dumps(out))
"""


def test_tensor_core_variant_compiles_without_shared_memory() -> None:
    """Compiled for sm_90 (no GPU needed; a fresh process, outside the interpreter), the
    tensor-core variant's K loop loads each weight row's words 16 bytes wide, x 16 bytes at a
    time and each row's two block scales as one 16-bit word, and never moves a tensor between
    register layouts through shared memory: the words, scales and x values of a K position meet
    in one thread. (With triton 3.6, the H200's, a [BN, threads, 4] word load spread the rows
    across lanes and sent every x value through shared memory, ten barriers per chunk and 96
    registers; 3.9 happened to place them well either way.)"""
    pytest.importorskip("triton.backends.nvidia")
    plain, swiglu4 = json.loads(run_fresh(_COMPILE_CHECK))
    # BN 4 rows + 4 x loads of one row; BN 8 rows + 4 x loads of each of 4 rows; one scale
    # load per row
    assert plain["loops"] == 1 and (plain["loads_16b"], plain["loads"]) == (4 + 4, 4 + 4 + 4)
    assert (swiglu4["loads_16b"], swiglu4["loads"]) == (8 + 4 * 4, 8 + 4 * 4 + 8)
    for st in (plain, swiglu4):
        assert st["shared"] == st["barriers"] == st["shuffles"] == 0, st
    if plain["regs"] is not None:  # cuobjdump ships with triton's NVIDIA backend
        assert plain["regs"] <= 72, plain
