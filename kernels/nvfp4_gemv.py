"""Small-batch decode GEMV of an NVFP4 weight: y [M, N] = x @ dequant(W)ᵀ, M <= 4.

(On sm_89+ the CUDA runtime runs batch 1 on kernels/fp8_mma.py instead, from a repacked copy of
the weight: kernels/nvfp4_mma.py. This kernel takes batches 2-4, and batch 1 without the copy.)

Weight format as in kernels/quant_gemm.py: w [N, K/2] uint8 (two e2m1 per byte, element 2i in the
low nibble), scale [N, K/16] e4m3 bytes (one per block of 16), a global fp32 scale (scalar or one
per row [N]); W[n, k] = e2m1(w) * e4m3(scale[n, k // 16]) * global[n].

quant_gemv's kernel spends ~47 sm_90 SASS instructions per 32-bit weight word (8 values) and
reaches ~47 % of the H200's copy bandwidth: it is instruction-bound. This one streams the weight
as 32-bit words with less work per word:

- layout: a program owns BN weight rows and up to 4 rows of x; thread t holds words
  [4t, 4t + 4) of each of its rows in every K chunk (32 values = 2 blocks: one 16-byte weight
  load and one 2-byte scale load per row) and the matching 32 x values (bf16 read as uint32
  pairs). Chunk = 1024 * warps values. The words are loaded as one [BN, 4 * threads] tile of
  contiguous K so the compiler keeps all BN rows of a K position in one thread (a [BN, threads,
  4] load had the rows spread across lanes, and every x value then went through shared memory
  to meet its weights: ten barriers per chunk; 349 -> 389 tok/s at Qwen3-8B batch 1), and the
  tensor-core variant reads a thread's two block scales per row as one 16-bit word, from
  offsets whose alignment the compiler cannot see, so that the scale tile gets the words'
  thread mapping (one pair per thread) instead of one that needs shared memory (96 -> 62
  registers at [4, 2, 1, mma]; 388.7 -> 412.4 tok/s). Each loop
  iteration computes UNROLL chunks that the previous one loaded and first issues the loads of
  the next UNROLL (in flight during compute).
- FMA variant (mma=False; also the interpreter's arithmetic): a word's 8 nibbles become four
  fp16x2 registers with 13 integer ops on the whole word (`_E2M1X8_ASM`:
  ((u << 9) | (u << 12)) & 0x8E008E00 with u = w & 0x0F0F0F0F puts nibbles 0 and 4 into two fp16
  lanes as (s << 15) | (eem << 9) = e2m1 * 2^-14 exactly, 0.5 being the fp16 subnormal), one
  f16 -> f32 conversion and one fp32 FMA per value and x row; a block's 16 products are summed
  before its e4m3 scale multiplies them once. ~36 SASS per word at batch 1.
- MMA variant (mma=True, CUDA, bf16 x): the same decode into bf16 pairs (e2m1 * 2^-126), times
  the block scale in bf16x2 (exact), then mma.sync m16n8k16 on lane-local data (see
  _E2M1X8_BF16_ASM and _MMA_ASM): the FMAs and conversions leave the CUDA cores. ~27-29 SASS per
  word at batch 1 and ~30-37 at batch 4 (the FMA variant needs ~65-80 there).
- ``swiglu_out`` (W = [gate; up]): a program's first BN/2 rows are gate rows j and the others
  their up rows j + N/2 (the MMA variant's row pairs), and it writes silu(gate) * up at j: the
  gate/up projection with the activation as its epilogue (fuse_swiglu_linear's out=swiglu).
Both variants are exact up to fp32 accumulation order (bf16 products of e2m1, e4m3 and x are exact;
tensor cores accumulate in fp32).

Launch shapes (`Nvfp4GemvConfig`) come from the H200 sweep (nvfp4_gemv_table.json, written by
``bench/nvfp4_gemv_bench.py --write-table``); `nvfp4_gemv_config` returns None where the sweep
found quant_linear's older path faster, and the documented defaults for unmeasured shapes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl

from kernels.launch import hw_fp8, interpreting, pdl_args, pdl_wait
from kernels.nvfp4_words import MMA_BIAS, _chunk, _load_chunk, _mma_chunk, _mma_rows, _store_sum
from kernels.quant_decode import fp8_bytes

MAX_M = 4  # rows of x one program takes
WORDS = 4  # 32-bit weight words per thread, row and chunk: one 16-byte load
VEC = 8 * WORDS  # K values per thread per chunk
DECODE_BIAS = 16384.0  # the decoded fp16 values are e2m1 * 2^-14


@triton.jit
def _nvfp4_gemv_kernel(
    x_ptr, w_ptr, s_ptr, g_ptr, y_ptr, M, N, K, gscale,
    stride_xm, stride_ym, stride_wn: tl.constexpr, stride_sn: tl.constexpr,
    HAS_G: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, R: tl.constexpr,
    UNROLL: tl.constexpr, X32: tl.constexpr, MMA: tl.constexpr, EVEN: tl.constexpr,
    HW: tl.constexpr, SWIGLU: tl.constexpr, PDL: tl.constexpr, S16: tl.constexpr,
):  # fmt: skip
    # grid (cdiv(N, BN), cdiv(M, BM)). w_ptr: the weight as int32 words [N, K/8] (stride_wn in
    # words); a chunk is R * 4 words (R = 32 * warps threads along K, all BN rows in each thread):
    # thread i holds words [4i, 4i + 4), blocks [2i, 2i + 2) and x values [32i, 32i + 32).
    # An iteration computes UNROLL chunks loaded by the one before (the first by the prologue)
    # and issues the next UNROLL chunks' loads first, so they are in flight during the compute.
    if SWIGLU:  # rows a: gate rows [j, j + BN/2), rows b: the matching up rows (N/2 further)
        h = tl.arange(0, BN)
        n = tl.program_id(0) * (BN // 2) + h % (BN // 2) + (h >= BN // 2).to(tl.int32) * (N // 2)
    else:
        n = tl.program_id(0) * BN + tl.arange(0, BN)
    nmask = n < N
    w_rows = w_ptr + n.to(tl.int64)[:, None] * stride_wn  # [BN, 1]
    if S16:  # a thread's two block scales of a row as one 16-bit load
        s_rows = s_ptr.to(tl.pointer_type(tl.uint16)) + n.to(tl.int64)[:, None] * (stride_sn // 2)
    else:
        s_rows = s_ptr + n.to(tl.int64)[:, None, None] * stride_sn
    i = tl.arange(0, R)
    # [1, 4R] word offsets, read as [BN, R, 4]: one load of contiguous words along K keeps all
    # BN rows of a K position in one thread (a [BN, R, 4] load spread the rows across lanes, and
    # every x value then took a trip through shared memory to meet its weights)
    wo = tl.arange(0, 4 * R)[None, :]
    if S16:  # [1, R] scale pairs, one per thread: contiguous along K (so threads run along K,
        # like the words) with an alignment the compiler cannot see (so no thread takes several)
        so = i[None, :] + ((N > 0).to(tl.int32) - 1)
    else:
        so = (i * 2)[None, :, None] + tl.arange(0, 2)[None, None, :]  # [1, R, 2]
    xo = (i * 32)[:, None] + tl.arange(0, 8)[None, :]  # [R, 8] x value offsets, + 8 per word
    xq = (i * 16)[:, None] + tl.arange(0, 4)[None, :]  # [R, 4] the same as bf16 pairs
    # x rows past M read row M - 1 (their results are not stored): no masks on x. X32: x_ptr and
    # stride_xm address bf16 pairs as int32
    m0 = tl.program_id(1) * BM
    x0 = x_ptr + m0.to(tl.int64) * stride_xm
    x1 = x_ptr + tl.minimum(m0 + 1, M - 1).to(tl.int64) * stride_xm
    x2 = x_ptr + tl.minimum(m0 + 2, M - 1).to(tl.int64) * stride_xm
    x3 = x_ptr + tl.minimum(m0 + 3, M - 1).to(tl.int64) * stride_xm
    one = (N > 0).to(tl.uint32)  # 1, opaque to the compiler (see _E2M1X8_ASM)
    KW = K // 8
    KB = K // 16
    acc0 = tl.zeros([BN, R], dtype=tl.float32)
    acc1 = acc0
    acc2 = acc0
    acc3 = acc0
    # MMA: per x row m, the D fragments dm0..dm3 [BN/2, R]
    d00 = tl.zeros([BN // 2 if MMA else 1, R], dtype=tl.float32)
    d01, d02, d03, d10, d11, d12, d13 = d00, d00, d00, d00, d00, d00, d00
    d20, d21, d22, d23, d30, d31, d32, d33 = d00, d00, d00, d00, d00, d00, d00, d00
    CW: tl.constexpr = 4 * R  # words per chunk
    w_a, s_a = _load_chunk(w_rows, s_rows, 0, wo, so, nmask, KW, KB, EVEN, S16)
    w_b, s_b = w_a, s_a
    if UNROLL > 1:
        w_b, s_b = _load_chunk(w_rows, s_rows, CW, wo, so, nmask, KW, KB, EVEN, S16)
    pdl_wait(PDL)  # the first chunks' weight loads overlap the previous kernel's tail
    for kw in range(0, KW, CW * UNROLL):
        nw = kw + CW * UNROLL
        p_a, q_a = _load_chunk(w_rows, s_rows, nw, wo, so, nmask, KW, KB, EVEN, S16)
        p_b, q_b = p_a, q_a
        if UNROLL > 1:
            p_b, q_b = _load_chunk(w_rows, s_rows, nw + CW, wo, so, nmask, KW, KB, EVEN, S16)
        if MMA:
            (d00, d01, d02, d03, d10, d11, d12, d13,
             d20, d21, d22, d23, d30, d31, d32, d33) = _mma_chunk(
                d00, d01, d02, d03, d10, d11, d12, d13, d20, d21, d22, d23, d30, d31, d32, d33,
                w_a, s_a, one, x0, x1, x2, x3, kw * 8, xq, K, BM, BN, R, EVEN, S16)  # fmt: skip
            if UNROLL > 1:
                (d00, d01, d02, d03, d10, d11, d12, d13,
                 d20, d21, d22, d23, d30, d31, d32, d33) = _mma_chunk(
                    d00, d01, d02, d03, d10, d11, d12, d13, d20, d21, d22, d23, d30, d31, d32,
                    d33, w_b, s_b, one, x0, x1, x2, x3, (kw + CW) * 8, xq, K, BM, BN, R, EVEN,
                    S16)  # fmt: skip
        else:
            acc0, acc1, acc2, acc3 = _chunk(acc0, acc1, acc2, acc3, w_a, s_a, one, x0, x1, x2,
                                            x3, kw * 8, xo, xq, K, BM, BN, R, X32, EVEN, HW)  # fmt: skip
            if UNROLL > 1:
                acc0, acc1, acc2, acc3 = _chunk(acc0, acc1, acc2, acc3, w_b, s_b, one, x0, x1,
                                                x2, x3, (kw + CW) * 8, xo, xq, K, BM, BN, R, X32,
                                                EVEN, HW)  # fmt: skip
        w_a, s_a, w_b, s_b = p_a, q_a, p_b, q_b
    if HAS_G:
        rs = tl.load(g_ptr + n, mask=nmask, other=0.0) * gscale
    else:
        rs = gscale
    y_row0 = y_ptr + m0.to(tl.int64) * stride_ym
    if MMA:
        y0 = _mma_rows(d00, d01, d02, d03, BN)
        y1 = _mma_rows(d10, d11, d12, d13, BN)
        y2 = _mma_rows(d20, d21, d22, d23, BN)
        y3 = _mma_rows(d30, d31, d32, d33, BN)
    else:
        y0 = tl.sum(acc0, axis=1)
        y1 = tl.sum(acc1, axis=1)
        y2 = tl.sum(acc2, axis=1)
        y3 = tl.sum(acc3, axis=1)
    _store_rows(y_row0, y0, rs, n, nmask, m0, M, SWIGLU, BN)
    if BM > 1:
        _store_rows(y_row0 + stride_ym, y1, rs, n, nmask, m0 + 1, M, SWIGLU, BN)
    if BM > 2:
        _store_rows(y_row0 + 2 * stride_ym, y2, rs, n, nmask, m0 + 2, M, SWIGLU, BN)
        _store_rows(y_row0 + 3 * stride_ym, y3, rs, n, nmask, m0 + 3, M, SWIGLU, BN)


@triton.jit
def _halves(v, BN: tl.constexpr):
    """[BN] -> its first and second halves."""
    return tl.split(tl.permute(tl.reshape(v, [2, BN // 2]), (1, 0)))


@triton.jit
def _store_rows(y_row, y, rs, n, nmask, m, M, SWIGLU: tl.constexpr, BN: tl.constexpr):
    """The rows' sums y [BN] times rs for x row m < M; with SWIGLU (first half gate rows j,
    second half their up rows) silu(gate) * up at j, gate and up rounded to y's dtype first as a
    separate activation would see them."""
    if SWIGLU:
        out = y_row.dtype.element_ty
        g, u = _halves(y * rs, BN)
        g = g.to(out).to(tl.float32)
        act = g * tl.sigmoid(g) * u.to(out).to(tl.float32)
        j, _ = _halves(n, BN)
        tl.store(y_row + j, act.to(out), mask=j * 0 + m < M)
    else:
        _store_sum(y_row, y, rs, n, nmask, m, M)


@dataclass(frozen=True)
class Nvfp4GemvConfig:
    """BN weight rows per program, num_warps (K chunk = 32 values * 32 * warps), chunks per loop
    iteration (1 or 2; the next iteration's are loaded while these are computed), and whether
    the products run on tensor cores (mma; CUDA only, bf16 x, bn >= 2; elsewhere the FMA
    variant runs)."""

    bn: int
    warps: int
    unroll: int = 1
    mma: bool = False

    def __post_init__(self) -> None:
        ok = self.bn in (1, 2, 4, 8, 16) and self.warps in (1, 2, 4, 8) and self.unroll in (1, 2)
        if not ok or (self.mma and self.bn < 2):
            raise ValueError(
                f"bad Nvfp4GemvConfig {self}: bn in 1..16 (power of 2, >= 2 with mma), warps "
                "1/2/4/8, unroll 1/2"
            )

    @property
    def bk(self) -> int:
        return VEC * 32 * self.warps


TABLE_PATH = Path(__file__).with_name("nvfp4_gemv_table.json")


def load_table(path: Path = TABLE_PATH) -> dict[tuple[int, int, int], Nvfp4GemvConfig | None]:
    """{(N, K, M): config} for the weights and batch buckets (M = 1, 2, 4) where the H200 sweep
    found this kernel faster than quant_linear's older nvfp4 path, and (N, K, 0): None for every
    measured weight. File format: {"N:K": {"M": [bn, warps, unroll, mma]}} (mma 0 or 1); a
    weight with an empty entry was measured and lost at every M."""
    if not path.exists():
        return {}
    table: dict[tuple[int, int, int], Nvfp4GemvConfig | None] = {}
    for key, per_m in json.loads(path.read_text()).items():
        n, k = (int(v) for v in key.split(":"))
        table[(n, k, 0)] = None
        for m, (bn, warps, unroll, mma) in per_m.items():
            table[(n, k, int(m))] = Nvfp4GemvConfig(int(bn), int(warps), int(unroll), bool(mma))
    return table


TABLE = load_table()  # read once at import
# Unmeasured shapes: the tensor-core variant with the fewest sm_90 SASS instructions per weight
# word among shapes whose 2 * 2048-value stage divides every model K (no masks): batch 1 4 rows x
# 2 chunks (27.8 instructions per word, ~80 registers); batches 2-4 8 rows x 1 chunk (29-33).
# Replace from the sweep (bench/nvfp4_gemv_bench.py --write-table).
DEFAULT_M1 = Nvfp4GemvConfig(4, 2, 2, mma=True)
DEFAULT_MULTI = Nvfp4GemvConfig(8, 2, 1, mma=True)
INTERPRETED = Nvfp4GemvConfig(8, 1, 1)  # CPU interpreter: few programs, same arithmetic


def table_config(
    table: dict[tuple[int, int, int], Nvfp4GemvConfig | None], N: int, K: int, M: int
) -> Nvfp4GemvConfig | None:
    """The launch shape `table` (see load_table) gives M rows of x against an [N, K] weight, or
    None: the older path. Measured weights: the entry of M rounded up to 1, 2 or 4 (none: the
    older path won there); others: DEFAULT_M1 / DEFAULT_MULTI (INTERPRETED under the
    interpreter)."""
    if M < 1 or M > MAX_M:
        return None
    bucket = 1 if M == 1 else 2 if M == 2 else MAX_M
    if (N, K, 0) in table:
        return table.get((N, K, bucket))
    if interpreting():
        return INTERPRETED
    return DEFAULT_M1 if M == 1 else DEFAULT_MULTI


def nvfp4_gemv_config(N: int, K: int, M: int) -> Nvfp4GemvConfig | None:
    """The launch shape for M rows of x against an [N, K] nvfp4 weight, or None where
    quant_linear's older path is the faster one (table_config of TABLE)."""
    return table_config(TABLE, N, K, M)


def _global_scale(g: float | torch.Tensor, N: int) -> tuple[float, torch.Tensor | None]:
    """(scalar factor, per-row fp32 [N] or None), as quant_linear reads global_scale: an [N]
    tensor stays on the device; a one-element tensor is read once (host sync)."""
    if isinstance(g, torch.Tensor):
        if g.numel() == N and N > 1:
            return 1.0, g.reshape(N).to(torch.float32).contiguous()
        if g.numel() != 1:
            raise ValueError(f"global_scale has {g.numel()} elements; expected 1 or N = {N}")
        return float(g), None
    return float(g), None


def nvfp4_gemv(
    x: torch.Tensor,
    w: torch.Tensor,
    scale: torch.Tensor,
    global_scale: float | torch.Tensor = 1.0,
    config: Nvfp4GemvConfig | None = None,
    swiglu_out: bool = False,
) -> torch.Tensor:
    """y [M, N] in x.dtype = x @ dequant(W)ᵀ (fp32 math); with ``swiglu_out`` (W = [gate; up],
    see swiglu_out_ok) silu(y[:, :N/2]) * y[:, N/2:] [M, N/2] from one launch, each program
    taking gate rows and their up rows. x [M, K] (bf16 / fp16 / fp32, last dim
    contiguous), w [N, K/2] uint8 and scale [N, K/16] uint8 or float8_e4m3fn with contiguous last
    dims, K a multiple of 16; w's rows must start on 4-byte boundaries (it is read as int32
    words). ``global_scale``: float, one-element tensor or fp32 [N]. ``config`` forces the launch
    shape (default: nvfp4_gemv_config, else DEFAULT_M1 / DEFAULT_MULTI). Any M works (programs
    take up to 4 rows of x); it is meant for decode batches. No host synchronisation unless
    global_scale is a one-element tensor."""
    if x.dim() != 2 or w.dim() != 2 or x.stride(-1) != 1 or w.stride(-1) != 1:
        raise ValueError("nvfp4_gemv: x [M, K] and w [N, K/2] need contiguous last dims")
    M, K = x.shape
    N = w.shape[0]
    scale = fp8_bytes(scale)
    if w.dtype != torch.uint8 or K % 16 or w.shape[1] != K // 2 or scale.shape != (N, K // 16):
        raise ValueError(
            f"nvfp4 weight: w [N, K/2] uint8, scale [N, K/16], K % 16 == 0; got x {tuple(x.shape)}, "
            f"w {tuple(w.shape)} {w.dtype}, scale {tuple(scale.shape)}"
        )
    if scale.stride(-1) != 1 or w.data_ptr() % 4 or w.stride(0) % 4:
        raise ValueError("nvfp4_gemv: w rows must be 4-byte aligned and scale rows contiguous")
    gscale, rows = _global_scale(global_scale, N)
    y = torch.empty((M, N // 2 if swiglu_out else N), dtype=x.dtype, device=x.device)
    if M == 0 or N == 0:
        return y
    cfg = config or nvfp4_gemv_config(N, K, M)
    if cfg is None:
        cfg = INTERPRETED if interpreting() else DEFAULT_M1 if M == 1 else DEFAULT_MULTI
    if swiglu_out and not swiglu_out_ok(N, cfg):
        raise ValueError(f"nvfp4_gemv: swiglu_out needs N / 2 a multiple of bn / 2; N {N}, {cfg}")
    bm = 1 if M == 1 else 2 if M == 2 else MAX_M
    even = K % (cfg.bk * cfg.unroll) == 0 and N % cfg.bn == 0
    words = w.view(torch.int32)  # [N, K/8]
    x32 = x.dtype == torch.bfloat16 and x.data_ptr() % 4 == 0 and x.stride(0) % 2 == 0
    xk = x.view(torch.int32) if x32 else x  # bf16: [M, K/2] pairs
    mma = cfg.mma and x32 and hw_fp8()  # tensor cores: CUDA and bf16 x only
    # the tensor-core variant reads a thread's two block scales as one 16-bit word
    s16 = mma and scale.data_ptr() % 2 == 0 and scale.stride(0) % 2 == 0 and K % 32 == 0
    _nvfp4_gemv_kernel[(triton.cdiv(N, cfg.bn), triton.cdiv(M, bm))](
        xk, words, scale, rows if rows is not None else words, y, M, N, K,
        gscale * (MMA_BIAS if mma else DECODE_BIAS), xk.stride(0), y.stride(0),
        stride_wn=words.stride(0), stride_sn=scale.stride(0),
        HAS_G=rows is not None, BM=bm, BN=cfg.bn, R=32 * cfg.warps, UNROLL=cfg.unroll,
        X32=x32, MMA=mma, EVEN=even, HW=hw_fp8(), SWIGLU=swiglu_out, S16=s16, num_warps=cfg.warps,
        num_stages=1, **pdl_args(x.device),
    )  # fmt: skip
    return y


def swiglu_out_ok(N: int, cfg: Nvfp4GemvConfig) -> bool:
    """Whether a program of ``cfg`` can pair its gate rows with their up rows in W [N, K]."""
    return cfg.bn >= 2 and N % 2 == 0 and (N // 2) % (cfg.bn // 2) == 0


def nvfp4_gemv_reference(
    x: torch.Tensor,
    w: torch.Tensor,
    scale: torch.Tensor,
    global_scale: float | torch.Tensor = 1.0,
) -> torch.Tensor:
    """Torch reference of :func:`nvfp4_gemv`: quant_gemm.dequantize_weight in fp32, fp32 matmul,
    x.dtype result."""
    from kernels.quant_gemm import dequantize_weight  # quant_gemm imports the GEMV modules

    wf = dequantize_weight(w, fp8_bytes(scale), "nvfp4", global_scale)
    return (x.float() @ wf.t()).to(x.dtype)


def compile_nvfp4_gemv(
    config: Nvfp4GemvConfig,
    *,
    bm: int,
    even: bool,
    swiglu_out: bool = False,
    arch: int = 90,
    k: int = 4096,
) -> Any:
    """The kernel compiled for sm_<arch> without a GPU (kernels/compile_check.py) as nvfp4_gemv
    launches it on Hopper for bf16 x (programmatic dependent launch; the tensor-core variant
    with 16-bit scale loads where ``config.mma``), pointers and strides specialised as for the
    model shapes."""
    from kernels.compile_check import compile_for_cuda

    sig = {"x_ptr": "*i32", "w_ptr": "*i32", "s_ptr": "*u8", "g_ptr": "*fp32", "y_ptr": "*bf16"}
    sig |= {"M": "i32", "N": "i32", "K": "i32", "gscale": "fp32"}
    sig |= {a: "i32" for a in ("stride_xm", "stride_ym")}
    const = {"HAS_G": False, "BM": bm, "BN": config.bn, "R": 32 * config.warps}
    const |= {"UNROLL": config.unroll, "X32": True, "MMA": config.mma, "EVEN": even, "HW": True}
    const |= {"SWIGLU": swiglu_out, "PDL": True, "S16": config.mma}
    const |= {"stride_wn": k // 8, "stride_sn": k // 16}
    divisible = [a for a in sig if a.endswith("_ptr") or a.startswith("stride") or a == "K"]
    return compile_for_cuda(
        _nvfp4_gemv_kernel, sig, const, divisible=divisible, num_warps=config.warps, arch=arch
    )
