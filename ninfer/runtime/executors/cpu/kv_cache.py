"""The reference executor's persistent step state: a paged KV pool and recurrent-state slots.

KV pool, per attention layer (see ninfer/runtime/step.py for block tables)::

    k[layer], v[layer]: [num_pages, page_size, kv_heads, head_dim]
    position p of a sequence lives at page block_table[p // page_size], row p % page_size

Quantised KV dtypes (int8, fp8, nvfp4, k8v4) are simulated: values are rounded through the
storage format on write (`fake_quant`) and kept dequantised, so attention sees exactly the
values a packed cache would return, at the memory cost of the compute dtype.

State slots, per Gated DeltaNet layer::

    conv[layer]: [num_slots, conv_dim, kernel_size - 1]   the last inputs of the causal conv
    ssm[layer]:  [num_slots, v_heads, k_dim, v_dim] f32   the delta-rule state S
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ninfer.ir.kv_formats import split_kv
from ninfer.ir.plan import KVLayout

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _round_e4m3(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).to(torch.float32)


def fake_quant(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """Round x [..., head_dim] through KV storage format `fmt` (scales per token and head)."""
    if fmt in ("f32", "bf16", "f16"):
        dt = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[fmt]
        return x.to(dt).to(x.dtype)
    xf = x.float()
    amax = xf.abs().amax(dim=-1, keepdim=True)
    if fmt == "int8":
        scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
        return ((xf / scale).round().clamp(-127, 127) * scale).to(x.dtype)
    if fmt == "fp8":
        scale = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
        return (_round_e4m3(xf / scale) * scale).to(x.dtype)
    if fmt == "nvfp4":
        gscale = torch.where(amax > 0, amax / (448.0 * 6.0), torch.ones_like(amax))  # [..., 1]
        blocks = xf.unflatten(-1, (-1, 16))  # [..., D/16, 16]
        bscale = (
            _round_e4m3(blocks.abs().amax(dim=-1, keepdim=True) / 6.0 / gscale[..., None])
            * gscale[..., None]
        )
        q = blocks / torch.where(bscale > 0, bscale, torch.ones_like(bscale))
        idx = (q.abs()[..., None] - E2M1.to(x.device)).abs().argmin(dim=-1)
        deq = E2M1.to(x.device)[idx] * q.sign() * bscale
        return deq.flatten(-2).to(x.dtype)
    raise ValueError(f"unknown KV format {fmt!r}")


class PagedKVCache:
    def __init__(self, kv: KVLayout, dtype: torch.dtype, device: torch.device):
        self.page_size = kv.page_size
        self.num_pages = kv.num_pages
        self.kv_dtype = kv.dtype
        self.k_fmt, self.v_fmt = split_kv(self.kv_dtype)
        self.k: dict[int, torch.Tensor] = {}
        self.v: dict[int, torch.Tensor] = {}
        for layer in kv.layers:
            shape = (self.num_pages, self.page_size, kv.kv_heads, kv.head_dim)
            self.k[layer] = torch.zeros(shape, dtype=dtype, device=device)
            self.v[layer] = torch.zeros(shape, dtype=dtype, device=device)

    def slots(self, block_table: tuple[int, ...], start: int, end: int) -> torch.Tensor:
        """Flat row indices [end - start] (page * page_size + row) of positions start..end-1
        in a [num_pages * page_size, kv_heads, head_dim] view of a layer's K or V. The same
        for every layer: a step computes them once per chunk and passes them to read/write."""
        need = -(-end // self.page_size)
        if len(block_table) < need:
            raise ValueError(
                f"block table of {len(block_table)} pages does not cover position {end - 1}"
            )
        device = next(iter(self.k.values())).device if self.k else torch.device("cpu")
        pos = torch.arange(start, end, device=device)
        pages = torch.tensor(block_table[:need], device=device, dtype=torch.long)
        return pages[pos // self.page_size] * self.page_size + pos % self.page_size

    def write(
        self,
        layer: int,
        block_table: tuple[int, ...],
        start: int,
        k: torch.Tensor,
        v: torch.Tensor,
        slots: torch.Tensor | None = None,
    ) -> None:
        """Store k, v [L, kv_heads, head_dim] at positions start..start+L-1 (`slots`: their
        `self.slots(block_table, start, start + L)`, when the caller has them)."""
        if slots is None:
            slots = self.slots(block_table, start, start + k.shape[0])
        kc, vc = self.k[layer], self.v[layer]
        kc.view(-1, *k.shape[1:]).index_copy_(0, slots, fake_quant(k, self.k_fmt).to(kc.dtype))
        vc.view(-1, *v.shape[1:]).index_copy_(0, slots, fake_quant(v, self.v_fmt).to(vc.dtype))

    def tensors(self) -> list[torch.Tensor]:
        """Every storage tensor [num_pages, ...] in a fixed order (K then V, by layer)."""
        return [t for layer in sorted(self.k) for t in (self.k[layer], self.v[layer])]

    def read(
        self,
        layer: int,
        block_table: tuple[int, ...],
        length: int,
        slots: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v [length, kv_heads, head_dim] of positions 0..length-1 (`slots`: their
        `self.slots(block_table, 0, length)`, when the caller has them)."""
        if slots is None:
            slots = self.slots(block_table, 0, length)
        k, v = self.k[layer], self.v[layer]
        return (
            k.view(-1, *k.shape[2:]).index_select(0, slots),
            v.view(-1, *v.shape[2:]).index_select(0, slots),
        )


def alloc_state(
    caches: dict[str, dict[str, Any]], rows: int, dtype: torch.dtype, device: torch.device
) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]]:
    """Zeroed recurrent state of each Gated DeltaNet layer of the plan's `caches`, by layer:
    conv tails [rows, conv_dim, kernel - 1] in `dtype` and f32 delta-rule states
    [rows, v_heads, k_dim, v_dim]."""
    conv: dict[int, torch.Tensor] = {}
    ssm: dict[int, torch.Tensor] = {}
    for c in caches.values():
        if c["kind"] != "state":
            continue
        i = c["layer"]
        conv[i] = torch.zeros(rows, c["conv_dim"], c["kernel_size"] - 1, dtype=dtype, device=device)
        ssm[i] = torch.zeros(
            rows, c["v_heads"], c["k_dim"], c["v_dim"], dtype=torch.float32, device=device
        )
    return conv, ssm


class StateSlots:
    """Recurrent state per Gated DeltaNet layer: conv tails [rows, conv_dim, kernel - 1]
    (compute dtype) and f32 delta-rule states [rows, v_heads, k_dim, v_dim], one row per slot
    (plus `extra_rows` an executor keeps for itself)."""

    extra_rows = 0

    def __init__(
        self,
        caches: dict[str, dict[str, Any]],
        num_slots: int,
        dtype: torch.dtype,
        device: torch.device,
    ):
        self.num_slots = num_slots
        self.conv, self.ssm = alloc_state(caches, num_slots + self.extra_rows, dtype, device)

    def copy(self, src: int, dst: int) -> None:
        for t in (*self.conv.values(), *self.ssm.values()):
            t[dst].copy_(t[src])

    def tensors(self) -> list[torch.Tensor]:
        """Every state tensor [rows, ...] in a fixed order (conv tails, then S, by layer)."""
        return [self.conv[i] for i in sorted(self.conv)] + [self.ssm[i] for i in sorted(self.ssm)]

    def reset(self, slots: Sequence[int]) -> None:
        """Zero the state of `slots` (sequences that start from position 0)."""
        if not slots:
            return
        idx = torch.tensor(list(slots), dtype=torch.long).to(next(iter(self.ssm.values())).device)
        for t in (*self.conv.values(), *self.ssm.values()):
            t.index_fill_(0, idx, 0)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.conv.values(), *self.ssm.values()))
