"""Paged KV cache layout, its quantised storage formats, torch writers and reference dequant.

Layout (one layer, K and V alike)::

    data  [num_pages, page_size, Hkv, X]     X = D (plain, int8, fp8) or D/2 (nvfp4)
    scale [num_pages, page_size, Hkv]        fp32, int8/fp8 only: one per (token, head)
          [num_pages, page_size, Hkv, D/16]  nvfp4: fp32, or uint8 = e4m3 bytes
    token t of a sequence lives at page block_table[t // page_size], row t % page_size;
    "slot" = page * page_size + row indexes the flattened [num_pages * page_size] axis.

Formats (``fmt``), chosen independently for K and V:

=========  ==============================  ================================================
fmt        element storage                 value
=========  ==============================  ================================================
plain      bf16 / fp16 / fp32              x
int8       int8                            q * scale, scale = amax(|x| over D) / 127
fp8        uint8 (e4m3fn bytes)            e4m3(q) * scale, scale = amax / 448
nvfp4      uint8, element 2i in low nibble e2m1(q) * scale[d // 16], scale = amax16 / 6
=========  ==============================  ================================================

``kv_dtype`` names used by the engine map to (k_fmt, v_fmt) through :data:`KV_DTYPES`;
``k8v4`` keeps K at 8 bits (fp8, attention logits are sensitive to K) and V at 4 bits.
The Triton helper :func:`load_kv_tile` is the only in-kernel reader of this layout.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.quant_decode import (
    E2M1_MAX,
    FP8_E4M3_MAX,
    decode_e2m1,
    decode_fp8,
    e2m1_to_f32,
    encode_e2m1,
    encode_fp8,
    fp8_raw_to_f32,
    fp8e4m3_to_f32,
)

FORMATS = ("plain", "int8", "fp8", "nvfp4")
FMT_CODE = {f: i for i, f in enumerate(FORMATS)}
KV_DTYPES: dict[str, tuple[str, str]] = {
    "auto": ("plain", "plain"),
    "int8": ("int8", "int8"),
    "fp8": ("fp8", "fp8"),
    "nvfp4": ("nvfp4", "nvfp4"),
    "k8v4": ("fp8", "nvfp4"),
}
NVFP4_BLOCK = 16


def quantize_kv(
    x: torch.Tensor, fmt: str, scale_dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x [..., D] float -> (data [..., X], scale) in format ``fmt`` (see module table).

    scale_dtype applies to nvfp4 only: torch.float32 or torch.uint8 (e4m3 bytes)."""
    if fmt == "plain":
        return x, None
    xf = x.to(torch.float32)
    if fmt in ("int8", "fp8"):
        qmax = 127.0 if fmt == "int8" else FP8_E4M3_MAX
        scale = xf.abs().amax(-1) / qmax  # [...]
        inv = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
        y = xf * inv[..., None]
        if fmt == "int8":
            return y.round().clamp(-127, 127).to(torch.int8), scale
        return encode_fp8(y), scale
    if fmt == "nvfp4":
        D = x.shape[-1]
        assert D % NVFP4_BLOCK == 0, "nvfp4 needs head_dim divisible by 16"
        blocks = xf.unflatten(-1, (D // NVFP4_BLOCK, NVFP4_BLOCK))  # [..., D/16, 16]
        scale = blocks.abs().amax(-1) / E2M1_MAX  # [..., D/16]
        if scale_dtype == torch.uint8:
            scale_bytes = encode_fp8(scale)
            scale = decode_fp8(scale_bytes)  # quantise against the scale actually stored
        else:
            assert scale_dtype == torch.float32
            scale_bytes = scale
        inv = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
        data = encode_e2m1((blocks * inv[..., None]).flatten(-2))
        return data, scale_bytes
    raise ValueError(f"unknown KV format {fmt!r}; expected one of {FORMATS}")


def dequantize_kv(data: torch.Tensor, scale: torch.Tensor | None, fmt: str) -> torch.Tensor:
    """Reference: (data [..., X], scale) -> float32 [..., D]."""
    if fmt == "plain":
        return data.to(torch.float32)
    if fmt == "int8":
        return data.to(torch.float32) * scale[..., None]
    if fmt == "fp8":
        return decode_fp8(data) * scale[..., None]
    if fmt == "nvfp4":
        s = decode_fp8(scale) if scale.dtype == torch.uint8 else scale.to(torch.float32)
        vals = decode_e2m1(data)  # [..., D]
        return (vals.unflatten(-1, (-1, NVFP4_BLOCK)) * s[..., None]).flatten(-2)
    raise ValueError(f"unknown KV format {fmt!r}; expected one of {FORMATS}")


def alloc_kv_cache(
    num_pages: int,
    page_size: int,
    num_kv_heads: int,
    head_dim: int,
    fmt: str,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cpu",
    scale_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Zeroed (data, scale) for one of K or V of one layer; ``dtype`` is for fmt 'plain'."""
    lead = (num_pages, page_size, num_kv_heads)
    if fmt == "plain":
        return torch.zeros(*lead, head_dim, dtype=dtype, device=device), None
    if fmt in ("int8", "fp8"):
        dt = torch.int8 if fmt == "int8" else torch.uint8
        return (
            torch.zeros(*lead, head_dim, dtype=dt, device=device),
            torch.zeros(*lead, dtype=torch.float32, device=device),
        )
    if fmt == "nvfp4":
        return (
            torch.zeros(*lead, head_dim // 2, dtype=torch.uint8, device=device),
            torch.zeros(*lead, head_dim // NVFP4_BLOCK, dtype=scale_dtype, device=device),
        )
    raise ValueError(f"unknown KV format {fmt!r}; expected one of {FORMATS}")


def write_kv(
    data: torch.Tensor, scale: torch.Tensor | None, x: torch.Tensor, slots: torch.Tensor, fmt: str
) -> None:
    """Quantise x [T, Hkv, D] and store token i at ``slots[i]`` (int, page*page_size+row).

    Mutates data (and scale) in place."""
    sdt = scale.dtype if (fmt == "nvfp4" and scale is not None) else torch.float32
    q, s = quantize_kv(x, fmt, scale_dtype=sdt)
    slots = slots.to(torch.long)
    target = as_kernel_arg(data)  # fp8 caches are written as their bytes
    target.view(-1, *data.shape[2:]).index_copy_(0, slots, q.to(target.dtype))
    if scale is not None:
        scale.view(-1, *scale.shape[2:]).index_copy_(0, slots, s.to(scale.dtype))


def gather_kv(
    data: torch.Tensor,
    scale: torch.Tensor | None,
    fmt: str,
    block_table: torch.Tensor,
    seq_len: int,
) -> torch.Tensor:
    """Reference: the first seq_len tokens of one sequence, dequantised: [seq_len, Hkv, D] f32."""
    page_size = data.shape[1]
    t = torch.arange(seq_len, device=data.device)
    slots = block_table.to(torch.long)[t // page_size] * page_size + t % page_size
    d = as_kernel_arg(data).view(-1, *data.shape[2:])[slots]
    s = None if scale is None else scale.view(-1, *scale.shape[2:])[slots]
    return dequantize_kv(d, s, fmt)


@triton.jit
def load_kv_tile(
    data_ptr,
    scale_ptr,
    slot,
    head,
    d,
    rmask,
    dmask,
    stride_slot,
    stride_head,
    sc_stride_slot,
    sc_stride_head,
    FMT: tl.constexpr,
    SCALE_FP8: tl.constexpr,
    HW_FP8: tl.constexpr,
):
    """Dequantised tile [BLOCK_N, BLOCK_D] fp32 of one KV head.

    slot: int64 [BLOCK_N]; d: int32 [BLOCK_D]; rmask [BLOCK_N] / dmask [BLOCK_D]: valid rows
    and dims; strides in elements of the data/scale tensors (flattened to [slots, Hkv, ...]).
    FMT: index into FORMATS. Masked entries are 0."""
    mask = rmask[:, None] & dmask[None, :]
    base = data_ptr + slot[:, None] * stride_slot + head * stride_head
    if FMT == 0:
        x = tl.load(base + d[None, :], mask=mask, other=0.0).to(tl.float32)
    elif FMT == 1 or FMT == 2:
        raw = tl.load(base + d[None, :], mask=mask, other=0)
        if FMT == 1:
            x = raw.to(tl.float32)
        else:
            x = fp8_raw_to_f32(raw, HW_FP8)
        s = tl.load(
            scale_ptr + slot * sc_stride_slot + head * sc_stride_head, mask=rmask, other=0.0
        )
        x = x * s[:, None]
    else:
        byte = tl.load(base + (d // 2)[None, :], mask=mask, other=0).to(tl.int32)
        nib = (byte >> ((d % 2) * 4)[None, :]) & 0xF
        x = e2m1_to_f32(nib)
        s = tl.load(
            scale_ptr + slot[:, None] * sc_stride_slot + head * sc_stride_head + (d // 16)[None, :],
            mask=mask,
            other=0,
        )
        if SCALE_FP8:
            s = fp8e4m3_to_f32(s.to(tl.int32))
        else:
            s = s.to(tl.float32)
        x = x * s
    return x


def kv_strides(data: torch.Tensor, scale: torch.Tensor | None) -> tuple[int, int, int, int]:
    """(stride_slot, stride_head, sc_stride_slot, sc_stride_head) for :func:`load_kv_tile`."""
    assert data.stride(0) == data.shape[1] * data.stride(1), "pages must be contiguous"
    assert data.stride(-1) == 1
    if scale is None:
        return data.stride(1), data.stride(2), 0, 0
    assert scale.stride(0) == scale.shape[1] * scale.stride(1)
    return data.stride(1), data.stride(2), scale.stride(1), scale.stride(2)


def as_kernel_arg(data: torch.Tensor) -> torch.Tensor:
    """float8 tensors travel as their bytes (the interpreter has no float8 type)."""
    return data.view(torch.uint8) if data.dtype == torch.float8_e4m3fn else data
