from __future__ import annotations

import json

import pytest
import torch

from kernels import fp8_gemv as fp8_gemv_mod
from kernels import quant_gemm
from kernels.compile_check import run_fresh
from kernels.fp8_gemv import Fp8GemvConfig, fp8_gemv, fp8_gemv_reference
from kernels.gemv import load_table
from kernels.quant_gemm import quant_linear, quant_linear_reference, quantize_weight_fp8


def _weight(N: int, K: int, device: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8 bytes [N, K] and scales [N]; rows of different magnitudes, some e4m3 subnormals."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=g) * torch.logspace(-2, 1, N)[:, None]
    w[:, ::7] *= 1e-4  # below 2^-6 of the row maximum: e4m3 subnormals
    q, s = quantize_weight_fp8(w)
    return q.to(device), s.to(device)


def _x(M: int, width: int, dtype: torch.dtype, device: str, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(M, width, generator=g).to(device, dtype)


@pytest.mark.parametrize("M", [1, 2, 3, 4])
@pytest.mark.parametrize("glu", [False, True])
@pytest.mark.parametrize(
    "cfg,N,K",
    [
        (Fp8GemvConfig(4, 1, 1), 24, 512),  # even: K a multiple of the chunk, N of BN
        (Fp8GemvConfig(2, 1, 2), 10, 1024),
        (Fp8GemvConfig(4, 1, 4), 7, 2100),  # ragged N and K: masked loads
        (Fp8GemvConfig(8, 2, 1), 5, 300),
    ],
)
def test_fp8_gemv_matches_reference(device, M, glu, cfg, N, K) -> None:
    """fp32 x: the kernel's only rounding is fp32 accumulation order."""
    q, s = _weight(N, K, device, seed=N + K)
    x = _x(M, 2 * K if glu else K, torch.float32, device, seed=M * 100 + K)
    y = fp8_gemv(x, q, s, cfg, glu=glu)
    assert y.shape == (M, N) and y.dtype == torch.float32
    ref = fp8_gemv_reference(x, q, s, glu=glu)
    torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-4 * float(ref.abs().max()))


def test_fp8_gemv_strided_rows_bf16(device) -> None:
    """bf16 x and float8_e4m3fn w whose rows are views of wider buffers (row stride > K); the
    weight's padding is NaN bytes, which a load past K would bring into the sum (caught on CUDA,
    where 0x7F decodes to NaN; the interpreter's bit-trick decode reads it as 480)."""
    N, K, M = 20, 640, 3
    q, s = _weight(N, K, device, seed=1)
    padded = torch.full((N, K + 48), 0x7F, dtype=torch.uint8, device=device)  # 0x7F: NaN
    padded[:, :K] = q
    x = _x(M, K + 64, torch.bfloat16, device, seed=2)[:, :K]
    y = fp8_gemv(x, padded[:, :K].view(torch.float8_e4m3fn), s, Fp8GemvConfig(4, 1, 2))
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), fp8_gemv_reference(x, q, s).float(), rtol=2e-2, atol=2e-2)


def test_fp8_gemv_decodes_every_byte(device) -> None:
    """The 254 finite e4m3 bytes (two rows of 127, and a zero) against one-hot x rows: y[i, n]
    is byte (n, i) decoded times the row scale, exactly, at every position of a thread's 16."""
    codes = torch.tensor([b for b in range(256) if b not in (0x7F, 0xFF)], dtype=torch.uint8)
    q = torch.nn.functional.pad(codes.view(2, 127), (0, 1))  # [2, 128]
    s = torch.tensor([0.5, 2.0])
    x = torch.eye(128)  # 128 rows: 32 programs of 4
    got = fp8_gemv(x.to(device), q.to(device), s.to(device), Fp8GemvConfig(2, 1, 1))
    want = q.view(torch.float8_e4m3fn).float().t() * s
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)


def test_reference_is_dequantised_matmul() -> None:
    q, s = _weight(6, 32, "cpu", seed=3)
    x = torch.randn(2, 64)
    g, u = x[:, :32], x[:, 32:]
    wf = q.view(torch.float8_e4m3fn).float() * s[:, None]
    torch.testing.assert_close(
        fp8_gemv_reference(x, q, s, glu=True), (torch.nn.functional.silu(g) * u) @ wf.t()
    )


def test_table_round_trip(tmp_path) -> None:
    p = tmp_path / "t.json"
    p.write_text('{"4096:12288:1": {"1": [2, 4, 2], "4": [4, 8, 1]}, "6144:4096:0": {}}')
    t = load_table(p, Fp8GemvConfig)
    assert t[(4096, 12288, True, 1)] == Fp8GemvConfig(2, 4, 2)
    assert t[(4096, 12288, True, 4)].bk == 16 * 32 * 8
    assert (6144, 4096, False, 1) not in t and (6144, 4096, False, 0) in t


def test_config_choice(monkeypatch) -> None:
    """Measured shapes follow the table per batch bucket (no entry: the older path, also for a
    shape measured with no win at all); others take the batch-1 default."""
    table = {
        (64, 32, False, 0): None,
        (64, 32, False, 1): Fp8GemvConfig(2, 4, 1),
        (64, 32, False, 4): Fp8GemvConfig(4, 8, 1),
        (96, 32, False, 0): None,
    }
    monkeypatch.setattr(fp8_gemv_mod, "TABLE", table)
    cfg = fp8_gemv_mod.fp8_gemv_config
    assert cfg(64, 32, 1) == Fp8GemvConfig(2, 4, 1)
    assert cfg(64, 32, 2) is None
    assert cfg(64, 32, 3) == Fp8GemvConfig(4, 8, 1)
    assert cfg(64, 32, 5) is None
    assert cfg(96, 32, 1) is None  # measured, the older path won
    default = (
        fp8_gemv_mod.INTERPRETED_M1 if fp8_gemv_mod.interpreting() else fp8_gemv_mod.DEFAULT_M1
    )
    assert cfg(64, 32, 1, glu=True) == default
    assert cfg(128, 32, 2) is None


@pytest.mark.parametrize("glu", [False, True])
@pytest.mark.parametrize("M", [1, 2, 4])
def test_quant_linear_fp8_dispatch(device, monkeypatch, glu, M) -> None:
    """quant_linear(fmt="fp8") runs the fp8 GEMV where fp8_gemv_config names a shape (the
    SwiGLU folded in) and the older paths (silu_mul first) elsewhere; both match the reference."""
    N, K = 24, 320
    q, s = _weight(N, K, device, seed=M)
    x = _x(M, 2 * K if glu else K, torch.float32, device, seed=M + 7)
    calls = []
    real = quant_gemm.fp8_gemv

    def spy(*args, **kwargs):
        calls.append(kwargs.get("glu"))
        return real(*args, **kwargs)

    monkeypatch.setattr(quant_gemm, "fp8_gemv", spy)
    table = {(N, K, glu, 0): None, (N, K, glu, 2): Fp8GemvConfig(4, 1, 2)}
    monkeypatch.setattr(fp8_gemv_mod, "TABLE", table)
    ref = quant_linear_reference(x, q, s, "fp8", glu=glu)
    y = quant_linear(x, q, s, "fp8", glu=glu)
    assert calls == ([glu] if M == 2 else [])
    torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-4 * float(ref.abs().max()))
    # an unmeasured shape takes the batch-1 default; a forced path never the fp8 GEMV
    monkeypatch.setattr(fp8_gemv_mod, "TABLE", {})
    calls.clear()
    quant_linear(x, q, s, "fp8", glu=glu)
    quant_linear(x, q, s, "fp8", glu=glu, path="tiled")
    assert calls == ([glu] if M == 1 else [])


_COMPILE_CHECK = """
import json
from kernels.compile_check import loop_stats
from kernels.fp8_gemv import Fp8GemvConfig, compile_fp8_gemv
out = []
for cfg, glu, bm in [(Fp8GemvConfig(4, 4, 2), False, 1), (Fp8GemvConfig(2, 8, 4), True, 4)]:
    k = compile_fp8_gemv(cfg, glu=glu, bm=bm, even=False)
    out.append(loop_stats(k.asm["ptx"])._asdict())
print(json.dumps(out))
"""


def test_fp8_gemv_compiles_for_sm90_without_shared_memory() -> None:
    """Compiled for sm_90 (no GPU needed; a fresh process, outside the interpreter), the K loop
    issues only 16-byte global loads (BN per chunk of weight bytes, 2 or 4 per x row) and never
    moves a tensor between register layouts through shared memory or byte permutes: the x halves
    match the weight bytes' layout."""
    pytest.importorskip("triton.backends.nvidia")
    plain, glu4 = json.loads(run_fresh(_COMPILE_CHECK))
    # BN 4 x 2 chunks of weight bytes + 2 chunks x 2 halves of one x row
    assert plain["loops"] == 1 and plain["loads"] == plain["loads_16b"] == 4 * 2 + 2 * 2
    # BN 2 x 4 chunks + 4 chunks x 4 rows x 2 halves x (gate, up)
    assert glu4["loads"] == glu4["loads_16b"] == 2 * 4 + 4 * 4 * 2 * 2
    for st in (plain, glu4):
        assert st["shared"] == st["barriers"] == st["prmt"] == st["shuffles"] == 0, st


@pytest.mark.gpu
@pytest.mark.parametrize(
    "N,K,glu", [(6144, 4096, False), (4096, 12288, True), (24576, 4096, False)]
)
def test_fp8_gemv_model_shapes(device, N, K, glu) -> None:
    q, s = _weight(N, K, device, seed=0)
    for M in (1, 2, 4):
        x = _x(M, 2 * K if glu else K, torch.bfloat16, device, seed=M)
        ref = fp8_gemv_reference(x, q, s, glu=glu).float()
        table = fp8_gemv_mod.TABLE.get((N, K, glu, M))  # the launch shape the step runs
        for cfg in (Fp8GemvConfig(1, 4, 2), Fp8GemvConfig(4, 8, 1), Fp8GemvConfig(2, 4, 4), table):
            if cfg is None:
                continue
            y = fp8_gemv(x, q, s, cfg, glu=glu).float()
            torch.testing.assert_close(y, ref, rtol=2e-2, atol=2e-2 * float(ref.abs().max()))
