"""The reduced draft head of --lm-head-draft (ninfer/spec/draft_head.py): on CPU the logits are
the drafters' matmul unchanged; the fp8 head (CUDA's default) runs its kernels here under the
Triton interpreter: its logits match the dequantised rows' for 1, 2, 4 and 16 rows (each a
different launch), and its argmax is the bf16 head's wherever the top two differ by more than
the quantisation error. On a GPU its calls also replay from a CUDA Graph."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before kernels/ is imported

from pathlib import Path

import pytest
import torch.nn.functional as F

from ninfer.spec.draft_head import (
    FP8_GEMV,
    FP8_MMA,
    FP8_SKINNY,
    QUANT_LINEAR,
    DraftHead,
    Launch,
    fp8_launch,
    measured_width,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
N, K = 300, 256
FIXTURE = Path(__file__).resolve().parents[2] / "artifacts" / "fixtures" / "tiny-agent.ninfer"


def _head_rows(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Ascending token ids [N] of a 1000-token vocabulary and fp32 LM-head-like rows [N, K] of
    different magnitudes (some values far below their row's maximum: e4m3 subnormals)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randperm(1000, generator=g)[:N].sort().values
    rows = 0.05 * torch.randn(N, K, generator=g) * torch.logspace(-0.5, 0.5, N)[:, None]
    rows[:, ::11] *= 1e-3
    return ids, rows


def _x(rows: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, K, generator=torch.Generator().manual_seed(seed))


def _dequantised(head: DraftHead) -> torch.Tensor:
    """The fp32 rows the fp8 head stands for."""
    return head.data.cpu().view(torch.float8_e4m3fn).float() * head.scale.cpu()[:, None]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_logits_are_the_drafters_matmul(dtype) -> None:
    """The MTP drafter's `h @ head.T` of 2-D rows and the DFlash drafter's F.linear of 3-D
    blocks, bit for bit; the head keeps the model dtype and the ascending ids."""
    ids, rows = _head_rows()
    head = DraftHead(ids, rows, dtype=dtype)
    assert not head.fp8 and head.rows.dtype == dtype and torch.equal(head.ids, ids)
    w = rows.to(dtype)
    h = _x(3, 1)
    assert torch.equal(head.logits(h), h.to(dtype).contiguous() @ w.T)
    block = _x(10, 2).view(2, 5, K)
    assert torch.equal(head.logits(block), F.linear(block.to(dtype), w))
    assert head.nbytes == N * K * w.element_size()


@pytest.mark.parametrize("rows", [1, 2, 4, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_logits_match_the_dequantised_rows(rows, dtype) -> None:
    """e4m3 bytes and row scales within half an e4m3 step of the given rows; logits [rows, N]
    in `dtype` against fp32 math on the dequantised rows: fp32 accumulation order only (fp32;
    the bf16 rows would be off by the quantisation error), or the bf16 output's rounding."""
    ids, w = _head_rows(seed=rows)
    head = DraftHead(ids, w, dtype=dtype, device=DEVICE, fp8=True)
    assert head.data.dtype == torch.uint8 and head.scale.dtype == torch.float32
    dq = _dequantised(head)
    step = torch.maximum(w.abs() * 2.0**-4, head.scale.cpu()[:, None] * 2.0**-10)
    assert bool(((w - dq).abs() <= step).all())
    h = _x(rows, 10 + rows)
    got = head.logits(h.to(DEVICE))
    assert got.shape == (rows, N) and got.dtype == dtype
    want = h.to(dtype).float() @ dq.T
    tol = 1e-4 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(
        got.cpu().float(), want, rtol=tol, atol=tol * float(want.abs().max())
    )


def test_wider_calls_take_the_model_dtype_rows() -> None:
    """Past fp8_max_rows (16 by default) the head reads its model-dtype rows, as the bf16 head
    would (on the H200 fp8 tiles lost to bf16 there); with fp8_max_rows None it keeps only the
    fp8 rows (half the bytes, plus the scales) and every call reads them."""
    ids, w = _head_rows(seed=2)
    h = _x(32, 3)
    head = DraftHead(ids, w, device=DEVICE, fp8=True)
    assert head.nbytes == N * K * 4 + N * K + 4 * N
    torch.testing.assert_close(head.logits(h.to(DEVICE)).cpu(), F.linear(h, w))
    only = DraftHead(ids, w, dtype=torch.bfloat16, device=DEVICE, fp8=True, fp8_max_rows=None)
    assert only.rows is None and only.nbytes == N * K + 4 * N
    want = h.to(torch.bfloat16).float() @ _dequantised(only).T
    got = only.logits(h.to(DEVICE)).cpu().float()
    torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2 * float(want.abs().max()))


def test_fp8_argmax_is_the_bf16_heads_beyond_the_quantisation_error() -> None:
    """16 hidden rows, 12 near one head row (a confident draft), 4 random; the fp8 head at 1
    (the first 6), 2, 4 and 16 rows a call picks the bf16 head's token wherever that token's
    bf16 logit, less the most quantisation can lower it, beats every other token's plus the
    most it can raise it (|h| @ (|w - dequantised w| + |w - bf16 w|)) and the logits' bf16
    rounding."""
    ids, w = _head_rows(seed=5)
    g = torch.Generator().manual_seed(6)
    t = torch.randint(N // 2, N, (12,), generator=g)  # rows of the larger norms
    near = 20.0 * w[t] / w[t].norm(dim=1, keepdim=True)
    h = torch.cat([near, torch.zeros(4, K)]) + 0.5 * torch.randn(16, K, generator=g)
    bf16 = DraftHead(ids, w, dtype=torch.bfloat16).logits(h).float()  # [16, N]
    fp8 = DraftHead(ids, w, dtype=torch.bfloat16, device=DEVICE, fp8=True)
    wb = w.to(torch.bfloat16).float()
    err = h.abs() @ ((w - _dequantised(fp8)).abs() + (w - wb).abs()).T  # [16, N]
    err = err + 2.0**-7 * bf16.abs()
    best = bf16.argmax(-1)
    low = (bf16 - err).gather(1, best[:, None])[:, 0]
    high = (bf16 + err).scatter(1, best[:, None], float("-inf")).max(-1).values
    decisive = low > high
    assert int(decisive.sum()) >= 12, decisive
    for per_call, n in ((1, 6), (2, 16), (4, 16), (16, 16)):  # 1 row a call: interpreted, slow
        picks = torch.cat(
            [fp8.logits(c.to(DEVICE)).argmax(-1).cpu() for c in h[:n].split(per_call)]
        )
        agree = picks == best[:n]
        assert bool(agree[decisive[:n]].all()), (per_call, agree, decisive)


def test_an_unmeasured_head_takes_the_nearest_measured_widths_launches(monkeypatch) -> None:
    """Qwen3-8B's reduced head (32768 x 4096) is not in the fp8 sweeps: it takes 24576 x 4096's
    launches (tensor cores at 1 row, fp8_gemv without them, quant_linear's tiles at 2 rows,
    where 24576 x 4096's fp8_gemv entries stop, and at 16 rows fp8_skinny's entry, or
    quant_linear's tiles where they won); a depth no sweep measured keeps fp8_gemv's
    batch-1 default."""
    from kernels.fp8_gemv import DEFAULT_M1, Fp8GemvConfig
    from kernels.fp8_mma import Fp8MmaConfig
    from kernels.fp8_skinny import fp8_skinny_config

    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the table choice a GPU makes
    assert measured_width(32768, 4096) == 24576 and measured_width(4096, 4096) == 4096
    assert fp8_launch(32768, 4096, 1) == Launch(FP8_MMA, Fp8MmaConfig(2, 2, 0))
    assert fp8_launch(32768, 4096, 1, tensor_cores=False) == Launch(
        FP8_GEMV, Fp8GemvConfig(4, 4, 1)
    )
    tiles = Launch(QUANT_LINEAR, "tiled")
    assert fp8_launch(32768, 4096, 2) == tiles
    fp8_tiles = fp8_skinny_config(32768, 4096, 16)  # its table's entry for the shape
    want = tiles if fp8_tiles is None else Launch(FP8_SKINNY, fp8_tiles)
    assert fp8_launch(32768, 4096, 16) == want
    assert fp8_launch(32768, 4096, 4096) == Launch(QUANT_LINEAR, "dense")
    assert measured_width(N, K) == N and fp8_launch(N, K, 1) == Launch(FP8_GEMV, DEFAULT_M1)


def test_the_artifacts_reduced_head_as_a_draft_head() -> None:
    """build_draft_head gives draft_head's ids and, on CPU, the logits of its rows; fp8 rows
    are quantised from the artifact's fp32 values."""
    from ninfer.artifact import Artifact
    from ninfer.spec.draft_vocab import build_draft_head, draft_head

    art = Artifact(str(FIXTURE))
    ids, rows = draft_head(art, torch.float32, torch.device("cpu"))
    head = build_draft_head(art, torch.float32, torch.device("cpu"))
    assert torch.equal(head.ids, ids) and torch.equal(head.rows, rows)
    h = torch.randn(2, rows.shape[1], generator=torch.Generator().manual_seed(3))
    assert torch.equal(head.logits(h), h @ rows.T)
    fp8 = build_draft_head(art, torch.float32, torch.device(DEVICE), fp8=True)
    assert fp8.shape == tuple(rows.shape) and fp8.data.device.type == DEVICE
    step = torch.maximum(rows.abs() * 2.0**-4, fp8.scale.cpu()[:, None] * 2.0**-10)
    assert bool(((rows - _dequantised(fp8)).abs() <= step).all())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("rows", [1, 2, 16])
def test_fp8_logits_replay_from_a_cuda_graph(rows) -> None:
    """The call the drafters capture: a CUDA Graph of it replays the eager logits."""
    ids, w = _head_rows()
    head = DraftHead(ids, w, dtype=torch.bfloat16, device="cuda")
    assert head.fp8
    x = _x(rows, 4).to("cuda", torch.bfloat16)
    want = head.logits(x)  # chooses the launch and compiles it
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = head.logits(x)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)
