"""Weight-only quantised GEMM / GEMV: y = x @ Wᵀ with W dequantised on the fly.

Weight formats (N output channels, K input features):

- ``fp8``:   w [N, K] uint8 or float8_e4m3fn (e4m3 bytes), scale [N] fp32;
             W[n, k] = e4m3(w[n, k]) * scale[n]
- ``nvfp4``: w [N, K/2] uint8, element 2i in the low nibble (e2m1, sign bit 3),
             scale [N, K/16] uint8 or float8_e4m3fn (e4m3 bytes), global_scale an fp32 scalar
             (float or one-element tensor) or an fp32 tensor [N] (one per output row, so that
             fused projections whose sources carry different global scales stay one GEMM);
             W[n, k] = e2m1(w[n, k // 2] nibble k % 2) * e4m3(scale[n, k // 16]) * global_scale[n]

x [M, K] bf16/fp16/fp32 (last dim contiguous) -> y [M, N] in x.dtype.

Paths, chosen from M (``quant_linear(path=...)`` forces one of the last three):

- fp8 tensor-core GEMV (fp8 decode of bf16 x on CUDA, M <= 4, where kernels/fp8_mma.py's
  measured table names a launch shape): e4m3 pairs to f16 in one instruction, lane-local
  mma.sync products;
- fp8 GEMV (fp8 decode, M <= 4, where kernels/fp8_gemv.py's measured table or its batch-1
  default names a launch shape): 16-byte weight loads, several K chunks in flight, the SwiGLU of
  ``glu`` folded in; the older paths below take the other shapes;
- nvfp4 GEMV (nvfp4 decode, M <= 4, where kernels/nvfp4_gemv.py's table or defaults name a
  launch shape): e2m1 decoded eight values per integer word, tensor-core or FMA products;
- ``gemv`` (decode, M <= GEMV_MAX_M[fmt]): CUDA-core kernel streaming K with the weight decoded
  in registers, fp32 accumulation, no atomics; it and its measured launch table live in
  kernels/quant_gemv.py (names re-exported here).
- ``tiled`` (small batches): tensor-core tiles (tl.dot) of the in-register dequantised weight,
  split-K with fp32 atomics when the tile grid is small.
- ``dense`` (prefill, M >= DENSE_MIN_M[fmt]): dequantise W once into an x.dtype scratch
  (fp8 bytes and nvfp4 values times block scale are exact in bf16; the row scale rounds once)
  and call torch's matmul (cuBLAS).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.fp8_gemv import fp8_gemv, fp8_gemv_config
from kernels.fp8_mma import fp8_mma, fp8_mma_config, usable
from kernels.launch import f32_dot, hw_fp8, interpreting
from kernels.nvfp4_gemv import Nvfp4GemvConfig, nvfp4_gemv, nvfp4_gemv_config, swiglu_out_ok
from kernels.quant_decode import (
    E2M1_MAX,
    FP8_E4M3_MAX,
    decode_e2m1,
    decode_fp8,
    e2m1_pairs_to_f32,
    encode_e2m1,
    encode_fp8,
    fp8_bytes,
    fp8_raw_to_f32,
)
from kernels.quant_gemv import (  # noqa: F401  (GEMV names re-exported for existing importers)
    GEMV_TABLE,
    GEMV_TABLE_PATH,
    GEMV_VEC,
    GemvConfig,
    gemv_config,
    launch_gemv,
    load_gemv_table,
    sm_count,
)
from kernels.silu_mul import silu_mul

# Path crossovers measured on the H200 (bench/results/gemv_h200.md, N = K = 8192 and
# N = 24576, K = 4096): the GEMV's FMA work grows with M, the tiled path's nvfp4 decode per
# M-tile makes it slow past a few tiles, the dense path pays one dequantisation pass.
GEMV_MAX_M = {"fp8": 2, "nvfp4": 4}  # largest M that takes the CUDA-core GEMV
DENSE_MIN_M = {"fp8": 1024, "nvfp4": 32}  # smallest M that dequantises once + torch matmul


@triton.jit
def _wq_gemm_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    rs_ptr,
    y_ptr,
    M,
    N,
    K,
    gscale,
    stride_xm,
    stride_wn,
    stride_sn,
    stride_ym,
    FMT: tl.constexpr,
    HAS_RS: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    SPLIT_K: tl.constexpr,
    F32_DOT: tl.constexpr,
    HW_FP8: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    m = pid_m * BM + tl.arange(0, BM)
    n = pid_n * BN + tl.arange(0, BN)
    mmask = m < M
    nmask = n < N
    kk = tl.arange(0, BK)
    x_rows = x_ptr + m.to(tl.int64)[:, None] * stride_xm
    w_rows = w_ptr + n.to(tl.int64)[:, None] * stride_wn
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    if FMT == 0:
        for k0 in range(pid_k * BK, K, BK * SPLIT_K):
            k = k0 + kk
            kmask = k < K
            x = tl.load(x_rows + k[None, :], mask=mmask[:, None] & kmask[None, :], other=0.0)
            raw = tl.load(w_rows + k[None, :], mask=nmask[:, None] & kmask[None, :], other=0)
            w = fp8_raw_to_f32(raw, HW_FP8)  # [BN, BK]
            if F32_DOT:
                acc += tl.dot(x.to(tl.float32), tl.trans(w), input_precision="ieee")
            else:
                acc += tl.dot(x, tl.trans(w.to(x.dtype)))
    else:
        # even and odd k live in the low and high nibbles: y = x_even @ W_loᵀ + x_odd @ W_hiᵀ,
        # so bytes load contiguously and nothing is interleaved in registers
        HALF: tl.constexpr = BK // 2
        NB: tl.constexpr = BK // 16
        j = tl.arange(0, HALF)
        jb = tl.arange(0, NB)
        for k0 in range(pid_k * BK, K, BK * SPLIT_K):
            kb = k0 // 2 + j  # byte index [HALF]
            bmask = kb < K // 2
            xmask = mmask[:, None] & bmask[None, :]
            x_even = tl.load(x_rows + (2 * kb)[None, :], mask=xmask, other=0.0)
            x_odd = tl.load(x_rows + (2 * kb + 1)[None, :], mask=xmask, other=0.0)
            raw = tl.load(w_rows + kb[None, :], mask=nmask[:, None] & bmask[None, :], other=0)
            sidx = k0 // 16 + jb
            sraw = tl.load(
                s_ptr + n.to(tl.int64)[:, None] * stride_sn + sidx[None, :],
                mask=nmask[:, None] & (sidx < K // 16)[None, :],
                other=0,
            )
            sc = fp8_raw_to_f32(sraw, HW_FP8)  # [BN, NB]
            sc = tl.reshape(tl.broadcast_to(sc[:, :, None], [BN, NB, 8]), [BN, HALF])
            w_lo, w_hi = e2m1_pairs_to_f32(raw, HW_FP8)  # values / 64
            w_lo = w_lo * sc
            w_hi = w_hi * sc
            if F32_DOT:
                acc += tl.dot(x_even.to(tl.float32), tl.trans(w_lo), input_precision="ieee")
                acc += tl.dot(x_odd.to(tl.float32), tl.trans(w_hi), input_precision="ieee")
            else:
                acc += tl.dot(x_even, tl.trans(w_lo.to(x_even.dtype)))
                acc += tl.dot(x_odd, tl.trans(w_hi.to(x_odd.dtype)))
    if HAS_RS:
        acc = acc * (tl.load(rs_ptr + n, mask=nmask, other=0.0) * gscale)[None, :]
    else:
        acc = acc * gscale
    y_ptrs = y_ptr + m.to(tl.int64)[:, None] * stride_ym + n[None, :]
    ymask = mmask[:, None] & nmask[None, :]
    if SPLIT_K == 1:
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=ymask)
    else:
        tl.atomic_add(y_ptrs, acc, mask=ymask)


@triton.jit
def _dequant_kernel(
    w_ptr,
    s_ptr,
    rs_ptr,
    out_ptr,
    N,
    K,
    gscale,
    stride_wn,
    stride_sn,
    stride_on,
    FMT: tl.constexpr,
    HAS_RS: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    HW: tl.constexpr,
):
    """out [N, K] (out dtype) = the full dequantised weight, row scales included."""
    n = tl.program_id(0) * BN + tl.arange(0, BN)
    nmask = n < N
    if HAS_RS:
        rs = (tl.load(rs_ptr + n, mask=nmask, other=0.0) * gscale)[:, None]
    else:
        rs = gscale
    o_rows = out_ptr + n.to(tl.int64)[:, None] * stride_on
    w_rows = w_ptr + n.to(tl.int64)[:, None] * stride_wn
    k0 = tl.program_id(1) * BK
    if FMT == 0:
        k = k0 + tl.arange(0, BK)[None, :]
        mask = nmask[:, None] & (k < K)
        w = fp8_raw_to_f32(tl.load(w_rows + k, mask=mask, other=0), HW)
        tl.store(o_rows + k, (w * rs).to(out_ptr.dtype.element_ty), mask=mask)
    else:
        kb = k0 // 2 + tl.arange(0, BK // 2)[None, :]
        bmask = nmask[:, None] & (kb < K // 2)
        lo, hi = e2m1_pairs_to_f32(tl.load(w_rows + kb, mask=bmask, other=0), HW)
        sidx = k0 // 16 + tl.arange(0, BK // 16)[None, :]
        sraw = tl.load(
            s_ptr + n.to(tl.int64)[:, None] * stride_sn + sidx,
            mask=nmask[:, None] & (sidx < K // 16),
            other=0,
        )
        sc = fp8_raw_to_f32(sraw, HW)  # [BN, BK/16]
        w = tl.reshape(tl.join(lo, hi), [BN, BK // 16, 16]) * sc[:, :, None]
        w = tl.reshape(w, [BN, BK]) * rs
        k = k0 + tl.arange(0, BK)[None, :]
        tl.store(o_rows + k, w.to(out_ptr.dtype.element_ty), mask=nmask[:, None] & (k < K))


def _tiled_config(M: int, N: int, K: int, device: torch.device) -> tuple[int, ...]:
    """(BM, BN, BK, SPLIT_K, num_warps, num_stages) of the tensor-core path."""
    if M <= 16:
        bm, bn, bk, warps, stages = 16, 64, 256, 4, 4
    elif M <= 64:
        bm, bn, bk, warps, stages = 64, 64, 64, 4, 4
    else:
        bm, bn, bk, warps, stages = 128, 128, 64, 8, 3
    split = 1
    if device.type == "cuda" and M <= 64:
        tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
        split = max(1, min(triton.cdiv(2 * sm_count(device), tiles), triton.cdiv(K, 4 * bk), 16))
    return bm, bn, bk, split, warps, stages


def _choose_path(M: int, fmt: str) -> str:
    if M <= GEMV_MAX_M[fmt]:
        return "gemv"
    return "dense" if M >= DENSE_MIN_M[fmt] else "tiled"


def quant_linear(
    x: torch.Tensor,
    w: torch.Tensor,
    scale: torch.Tensor,
    fmt: str,
    global_scale: float | torch.Tensor = 1.0,
    *,
    split_k: int | None = None,
    path: str | None = None,
    config: GemvConfig | None = None,
    glu: bool = False,
    swiglu_out: bool = False,
) -> torch.Tensor:
    """y [M, N] = f(x) @ dequant(W)ᵀ for ``fmt`` in {"fp8", "nvfp4"}; see module docstring.
    f(x) = x [M, K], or with ``glu`` silu(x[:, :K]) * x[:, K:] of x [M, 2K] (gate | up): folded
    into the fp8 GEMV where that runs, else computed first by the silu_mul kernel.
    ``swiglu_out`` (W = [gate; up]): the result is silu(y[:, :N/2]) * y[:, N/2:] [M, N/2],
    computed in the fp8 tensor-core GEMV's epilogue where that runs, else by silu_mul after.

    ``path`` forces "gemv", "tiled" or "dense" (default: from M and, for fp8 decode, the fp8
    GEMV's table); ``split_k`` forces the tiled path's K split; ``config`` the quant_gemv launch
    shape (any of the three keeps the fp8 GEMV out).
    No host synchronisation unless ``global_scale`` is a one-element tensor (read once; pass a
    float or a [N] tensor)."""
    assert x.dim() == 2 and x.stride(-1) == 1
    auto = path is None and split_k is None and config is None
    if swiglu_out:
        mma_cfg = fp8_mma_config(w.shape[0], w.shape[1], x.shape[0]) if fmt == "fp8" else None
        if auto and not glu and mma_cfg is not None and usable(x, w):
            return fp8_mma(x, w, scale.to(torch.float32), mma_cfg, swiglu_out=True)
        cfg = _nvfp4_config(x, w) if fmt == "nvfp4" and auto and not glu else None
        if cfg is not None and swiglu_out_ok(w.shape[0], cfg):
            return nvfp4_gemv(x, w, scale, global_scale, cfg, swiglu_out=True)
        y = quant_linear(x, w, scale, fmt, global_scale, split_k=split_k, path=path,
                         config=config, glu=glu)  # fmt: skip
        return silu_mul(y)
    if fmt == "fp8" and auto:
        mma_cfg = fp8_mma_config(w.shape[0], w.shape[1], x.shape[0], glu)
        if mma_cfg is not None and usable(x, w):
            return fp8_mma(x, w, scale.to(torch.float32), mma_cfg, glu=glu)
        fp8_cfg = fp8_gemv_config(w.shape[0], w.shape[1], x.shape[0], glu)
        if fp8_cfg is not None:
            return fp8_gemv(x, w, scale.to(torch.float32), fp8_cfg, glu=glu)
    if glu:
        x = silu_mul(x)
    if fmt == "nvfp4" and auto and (cfg := _nvfp4_config(x, w)) is not None:
        return nvfp4_gemv(x, w, scale, global_scale, cfg)
    M, K = x.shape
    N = w.shape[0]
    w = fp8_bytes(w) if fmt == "fp8" else w
    gscale = 1.0
    row_scale: torch.Tensor | None
    if fmt == "fp8":
        assert w.shape == (N, K) and scale.shape == (N,), "fp8 weight: w [N, K], scale [N]"
        row_scale = scale.to(torch.float32)
    elif fmt == "nvfp4":
        assert K % 16 == 0 and w.shape == (N, K // 2) and scale.shape == (N, K // 16), (
            "nvfp4 weight: w [N, K/2], scale [N, K/16]"
        )
        scale = fp8_bytes(scale)
        row_scale = None
        if isinstance(global_scale, torch.Tensor) and global_scale.numel() == N and N > 1:
            row_scale = global_scale.reshape(N).to(torch.float32)
        elif isinstance(global_scale, torch.Tensor):
            gscale = float(global_scale)  # a load-time constant; read once
        else:
            gscale = float(global_scale)
    else:
        raise ValueError(f"unknown weight format {fmt!r}; expected 'fp8' or 'nvfp4'")
    assert w.stride(-1) == 1 and scale.stride(-1) == 1
    has_rs = row_scale is not None
    rs = row_scale if has_rs else scale  # a valid pointer either way
    stride_sn = scale.stride(0) if scale.dim() == 2 else 0
    if path is None:
        path = "tiled" if split_k is not None else _choose_path(M, fmt)
    if M == 0:
        return torch.empty((0, N), dtype=x.dtype, device=x.device)
    if path == "gemv":
        return launch_gemv(x, w, scale, rs, fmt=fmt, gscale=gscale, has_rs=has_rs, config=config)
    if path == "dense":
        wd = dequantize_weight_into(w, scale, fmt, gscale, row_scale, x.dtype)
        return torch.nn.functional.linear(x, wd)
    if path != "tiled":
        raise ValueError(f"unknown quant_linear path {path!r}; expected gemv, tiled or dense")
    bm, bn, bk, split, warps, stages = _tiled_config(M, N, K, x.device)
    if split_k is not None:
        split = split_k
    if split > 1:
        y = torch.zeros((M, N), dtype=torch.float32, device=x.device)
    else:
        y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(M, bm), triton.cdiv(N, bn), split)
    _wq_gemm_kernel[grid](
        x,
        w,
        scale,
        rs,
        y,
        M,
        N,
        K,
        gscale * (64.0 if fmt == "nvfp4" else 1.0),
        x.stride(0),
        w.stride(0),
        stride_sn,
        y.stride(0),
        FMT=0 if fmt == "fp8" else 1,
        HAS_RS=has_rs,
        BM=bm,
        BN=bn,
        BK=bk,
        SPLIT_K=split,
        F32_DOT=f32_dot(x.dtype),
        HW_FP8=hw_fp8(),
        num_warps=warps,
        num_stages=stages,
    )
    return y if split == 1 else y.to(x.dtype)


def dequantize_weight_into(
    w: torch.Tensor,
    scale: torch.Tensor,
    fmt: str,
    gscale: float,
    row_scale: torch.Tensor | None,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The dequantised weight [N, K] in ``dtype``, computed on w's device by one kernel
    (W[n, k] rounded once); w, scale as raw bytes (see quant_linear)."""
    N = w.shape[0]
    K = w.shape[1] * (2 if fmt == "nvfp4" else 1)
    out = torch.empty((N, K), dtype=dtype, device=w.device)
    has_rs = row_scale is not None
    bn, bk = (16, 256) if interpreting() else (32, 512)
    _dequant_kernel[(triton.cdiv(N, bn), triton.cdiv(K, bk))](
        w,
        scale,
        row_scale if has_rs else scale,
        out,
        N,
        K,
        gscale * (64.0 if fmt == "nvfp4" else 1.0),
        w.stride(0),
        scale.stride(0) if scale.dim() == 2 else 0,
        out.stride(0),
        FMT=0 if fmt == "fp8" else 1,
        HAS_RS=has_rs or fmt == "fp8",
        BN=bn,
        BK=bk,
        HW=hw_fp8(),
        num_warps=4,
    )
    return out


def dequantize_weight(
    w: torch.Tensor, scale: torch.Tensor, fmt: str, global_scale: float | torch.Tensor = 1.0
) -> torch.Tensor:
    """Reference: the float32 [N, K] matrix a quantised weight stands for."""
    if fmt == "fp8":
        return decode_fp8(w) * scale.to(torch.float32)[:, None]
    if fmt == "nvfp4":
        vals = decode_e2m1(w)  # [N, K]
        s = decode_fp8(scale).repeat_interleave(16, dim=1)
        if isinstance(global_scale, torch.Tensor) and global_scale.numel() > 1:
            return vals * s * global_scale.to(torch.float32).reshape(-1, 1)
        return vals * s * float(global_scale)
    raise ValueError(f"unknown weight format {fmt!r}; expected 'fp8' or 'nvfp4'")


def _nvfp4_config(x: torch.Tensor, w: torch.Tensor) -> Nvfp4GemvConfig | None:
    """The nvfp4 GEMV's launch shape for x against packed w, or None where it does not run."""
    aligned = w.data_ptr() % 4 == 0 and w.stride(0) % 4 == 0 and w.dtype == torch.uint8
    return nvfp4_gemv_config(w.shape[0], x.shape[1], x.shape[0]) if aligned else None


def quant_linear_reference(
    x: torch.Tensor,
    w: torch.Tensor,
    scale: torch.Tensor,
    fmt: str,
    global_scale: float | torch.Tensor = 1.0,
    *,
    glu: bool = False,
) -> torch.Tensor:
    """Torch reference of :func:`quant_linear` (fp32 math, x.dtype result)."""
    xf = x.float()
    if glu:
        g, u = xf.chunk(2, dim=-1)
        xf = torch.nn.functional.silu(g) * u
    return (xf @ dequantize_weight(w, scale, fmt, global_scale).T).to(x.dtype)


def quantize_weight_fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] float -> (e4m3 bytes [N, K] uint8, per-channel scale [N] fp32)."""
    scale = w.float().abs().amax(1).clamp(min=1e-12) / FP8_E4M3_MAX
    return encode_fp8(w.float() / scale[:, None]), scale


def quantize_weight_nvfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
    """w [N, K] float -> (packed [N, K/2] uint8, e4m3 scale bytes [N, K/16], global scale)."""
    N, K = w.shape
    wf = w.float()
    global_scale = max(float(wf.abs().max()), 1e-12) / (FP8_E4M3_MAX * E2M1_MAX)
    blocks = wf.view(N, K // 16, 16)
    s_bytes = encode_fp8(blocks.abs().amax(-1) / E2M1_MAX / global_scale)
    s = decode_fp8(s_bytes) * global_scale  # effective block scale actually stored
    inv = torch.where(s > 0, 1.0 / s, torch.zeros_like(s))
    return encode_e2m1((blocks * inv[..., None]).view(N, K)), s_bytes, global_scale
