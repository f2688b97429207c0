"""The device KV pool and recurrent-state slots of the CUDA executor.

KV pool, per attention layer, K and V alike (the layout of kernels/kv_cache.py)::

    data  [num_pages + 1, page_size, kv_heads, X]   X = head_dim (bf16/f32/int8/fp8) or head_dim/2 (nvfp4)
    scale [num_pages + 1, page_size, kv_heads]      f32, int8 / fp8 only
          [num_pages + 1, page_size, kv_heads, head_dim/16]  e4m3 bytes, nvfp4 only
    position p of a sequence lives at slot block_table[p // page_size] * page_size + p % page_size

Page `num_pages` (one past the engine's pages) is scratch: CUDA Graph warm-up and capture
write there, so they never touch a page the engine owns. State slots likewise keep one scratch
slot past `num_slots`.

Every write is graph-capturable: no host synchronisation and no host-to-device copies (the
e2m1 rounding table is made once, here, instead of per call as kernels.kv_cache does).
"""

from __future__ import annotations

from typing import Any

import torch

from kernels.kv_cache import alloc_kv_cache, quantize_kv
from kernels.quant_decode import E2M1_MAX, decode_fp8, encode_fp8
from ninfer.ir.kv_formats import split_kv
from ninfer.ir.plan import KVLayout, Plan
from ninfer.passes.options import HEADROOM
from ninfer.runtime.executors.cpu.kv_cache import StateSlots

# the plan's KV storage names -> kernels.kv_cache formats
_KERNEL_FMT = {
    "f32": "plain",
    "bf16": "plain",
    "f16": "plain",
    "int8": "int8",
    "fp8": "fp8",
    "nvfp4": "nvfp4",
}
_PLAIN_DTYPE = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
# midpoints between consecutive e2m1 magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}
_E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


class CudaKVCache:
    """Paged K/V storage for every attention layer of a plan, on one device."""

    def __init__(self, kv: KVLayout, num_pages: int, device: torch.device):
        self.page_size = kv.page_size
        self.num_pages = num_pages
        self.scratch_page = num_pages
        self.kv_dtype = kv.dtype
        k_store, v_store = split_kv(self.kv_dtype)
        self.k_fmt, self.v_fmt = _KERNEL_FMT[k_store], _KERNEL_FMT[v_store]
        self._thresholds = torch.tensor(_E2M1_MIDPOINTS, dtype=torch.float32, device=device)
        self.k: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = {}
        self.v: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = {}
        for layer in kv.layers:
            for store, fmt, table in ((k_store, self.k_fmt, self.k), (v_store, self.v_fmt, self.v)):
                table[layer] = alloc_kv_cache(
                    num_pages + 1, self.page_size, kv.kv_heads, kv.head_dim, fmt,
                    _PLAIN_DTYPE.get(store, torch.bfloat16), device, torch.uint8,
                )  # fmt: skip

    def nbytes(self) -> int:
        return sum(
            t.numel() * t.element_size()
            for d in (self.k, self.v)
            for p in d.values()
            for t in p
            if t is not None
        )

    def tensors(self) -> list[torch.Tensor]:
        """Every storage tensor [num_pages + 1, ...] (data, then scales when the format has
        them; K then V; by layer) in a fixed order: what a host snapshot copies per page."""
        out = []
        for layer in sorted(self.k):
            for data, scale in (self.k[layer], self.v[layer]):
                out.append(data)
                if scale is not None:
                    out.append(scale)
        return out

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        """Store k, v [T, kv_heads, head_dim] at flat slots [T] (int32/int64)."""
        slots = slots.to(torch.long)
        for x, fmt, (data, scale) in (
            (k, self.k_fmt, self.k[layer]),
            (v, self.v_fmt, self.v[layer]),
        ):
            q, s = self._quantize(x, fmt)
            data.view(-1, *data.shape[2:]).index_copy_(0, slots, q.to(data.dtype))
            if scale is not None:
                scale.view(-1, *scale.shape[2:]).index_copy_(0, slots, s.to(scale.dtype))

    def _quantize(self, x: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor | None]:
        if fmt != "nvfp4":
            return quantize_kv(x, fmt)
        # as kernels.kv_cache.quantize_kv(x, "nvfp4", torch.uint8), without per-call tables
        blocks = x.float().unflatten(-1, (-1, 16))  # [T, H, D/16, 16]
        scale_bytes = encode_fp8(blocks.abs().amax(-1) / E2M1_MAX)  # [T, H, D/16]
        scale = decode_fp8(scale_bytes)
        inv = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
        return self._encode_e2m1((blocks * inv[..., None]).flatten(-2)), scale_bytes

    def _encode_e2m1(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., D] (|x| <= 6 after scaling) -> packed nibbles [..., D/2]; nearest e2m1
        magnitude, ties to the even code (the rounding of kernels.quant_decode.encode_e2m1)."""
        a = x.abs().clamp(max=E2M1_MAX).unsqueeze(-1)  # [..., D, 1]
        code = (a > self._thresholds).sum(-1)  # lower code on a tie
        tie = (a == self._thresholds).any(-1)
        code = torch.where(tie & (code % 2 == 1), code + 1, code)
        code = (code | ((x < 0).long() << 3)).to(torch.uint8).unflatten(-1, (-1, 2))
        return code[..., 0] | (code[..., 1] << 4)

    def kernel_args(self, layer: int) -> dict[str, Any]:
        """Keyword arguments of kernels.paged_decode / paged_prefill for one layer."""
        (kd, ks), (vd, vs) = self.k[layer], self.v[layer]
        return {
            "k_cache": kd,
            "v_cache": vd,
            "k_scale": ks,
            "v_scale": vs,
            "k_fmt": self.k_fmt,
            "v_fmt": self.v_fmt,
        }


class CudaStateSlots(StateSlots):
    """The reference StateSlots with one more row, `scratch_slot` (= num_slots): the state
    rows of a CUDA Graph's padding sequences, which never touch a live slot."""

    extra_rows = 1

    @property
    def scratch_slot(self) -> int:
        return self.num_slots


def auto_pages(plan: Plan, device: torch.device) -> int:
    """--kv-capacity auto: the KV pages the free memory of `device` holds after the weights,
    the plan's workspace and state slots and HEADROOM, less one scratch page; never more than
    the plan's pool, which auto caps at what the lanes can use (a small model's whole GPU was
    more tokens than the engine addresses). ConfigError when not one page fits."""
    free, _ = torch.cuda.mem_get_info(device)
    per_page = plan.kv.bytes_per_page
    if per_page == 0:
        return plan.kv.num_pages
    ledger = plan.ledger
    avail = free - HEADROOM - ledger.bytes_of("workspace") - ledger.bytes_of("state_slots")
    pages = min(avail // per_page - 1, plan.kv.num_pages)
    if pages < 1:
        from ninfer.errors import ConfigError

        raise ConfigError(
            f"--kv-capacity auto: only {free / 2**30:.1f} GiB free on {device} after the weights"
        )
    return int(pages)
