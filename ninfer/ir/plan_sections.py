"""The typed sections of a plan: the options it was compiled with, the KV layout, the
recurrent-state slots and the memory ledger. Frozen; built by passes/lower.py from what the
passes decided, read by the executors and the server by attribute (a missing field is an
error at compile time, not a fallback at run time).

JSON (Plan.to_dict; docs/plan.md): each section is an object of its fields, as below; the
KV fields of attention layers (kv_heads .. v_layout) are left out of a plan with none.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True)
class PlanOptions:
    """The compile options as the plan records them (CompileOptions less the device, with the
    compute dtype resolved; cuda_graphs is False on cpu)."""

    dtype: str  # float32 | bfloat16 | float16
    kv_dtype: str | None  # as asked (None: the default the kv section names)
    max_concurrency: int  # decode lanes
    max_context: int  # tokens per sequence
    kv_capacity: int | str | None  # tokens | "auto" | None (= max_context)
    page_size: int  # tokens per KV page
    prefill_chunk: int  # prefill tokens per step
    device_state_slots: int | None
    cuda_graphs: bool
    device_memory: int | None  # bytes the plan may use; None: the device default


@dataclass(frozen=True)
class KVLayout:
    """The paged KV cache: `num_pages` pages of `page_size` tokens of every attention layer."""

    dtype: str  # ninfer.ir.kv_formats.KV_DTYPES
    page_size: int
    layers: tuple[int, ...]  # attention layers
    bytes_per_token: int  # all attention layers, K and V, scales included
    bytes_per_page: int
    capacity_tokens: int  # num_pages * page_size
    num_pages: int
    kv_heads: int | None = None  # (attention layers only, the rest too)
    head_dim: int | None = None
    k_layout: str | None = None  # storage of K per layer, e.g. "bf16[pages, page_size, 8, 128]"
    v_layout: str | None = None


@dataclass(frozen=True)
class StateLayout:
    """Recurrent-state slots of the linear-attention layers (hybrid models; none: no layers)."""

    layers: tuple[int, ...]
    slots: int
    bytes_per_slot: int
    layout: str


@dataclass(frozen=True)
class VisionLayout:
    """The vision tower a plan runs (--vision; None without): its calls are those with
    attrs["stage"] == "vision", run once per image or video apart from the steps. Units:
    patches (pixels for patch_size), channels for hidden / out_hidden."""

    blocks: int
    hidden: int
    heads: int
    patch_size: int
    temporal_patch_size: int
    merge_size: int
    in_channels: int
    out_hidden: int  # = the text model's hidden size
    grid_side: int  # the learned position embedding grid is grid_side x grid_side
    image_token_id: int  # the placeholder ids the embeddings replace
    video_token_id: int


@dataclass(frozen=True)
class ParallelLayout:
    """Tensor parallelism (passes/shard.py): this plan is rank `rank` of `world`; its calls
    hold `all_reduce` all-reduces (one per mixer and per FFN) and `all_gather` gathers (the
    logits)."""

    world: int
    rank: int
    all_reduce: int
    all_gather: int


@dataclass(frozen=True)
class LedgerEntry:
    item: str  # weights | nvfp4_copies | workspace | kv_cache | state_slots
    bytes: int
    detail: str


@dataclass(frozen=True)
class Ledger:
    """Where the plan's memory goes; `total` <= `budget` (bytes)."""

    entries: tuple[LedgerEntry, ...]
    total: int
    budget: int

    def bytes_of(self, item: str) -> int:
        """Bytes of ledger item `item`; 0 where the plan has none."""
        return next((e.bytes for e in self.entries if e.item == item), 0)

    def has(self, item: str) -> bool:
        return any(e.item == item for e in self.entries)


def section_dict(section: Any) -> dict[str, Any]:
    """A section as its JSON object (tuples as lists, absent optional KV fields left out)."""
    d = asdict(section)
    if isinstance(section, KVLayout):
        d = {k: v for k, v in d.items() if v is not None}
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


def kv_from_dict(d: dict[str, Any]) -> KVLayout:
    return KVLayout(**{**_known(KVLayout, d), "layers": tuple(d["layers"])})


def state_from_dict(d: dict[str, Any]) -> StateLayout:
    return StateLayout(**{**_known(StateLayout, d), "layers": tuple(d["layers"])})


def ledger_from_dict(d: dict[str, Any]) -> Ledger:
    entries = tuple(LedgerEntry(**e) for e in d["entries"])
    return Ledger(entries, d["total"], d["budget"])


def vision_from_dict(d: dict[str, Any] | None) -> VisionLayout | None:
    return None if d is None else VisionLayout(**_known(VisionLayout, d))


def parallel_from_dict(d: dict[str, Any] | None) -> ParallelLayout | None:
    return None if d is None else ParallelLayout(**_known(ParallelLayout, d))


def options_from_dict(d: dict[str, Any]) -> PlanOptions:
    return PlanOptions(**_known(PlanOptions, d))


def _known(cls: type, d: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise ValueError(f"plan {cls.__name__}: unknown fields {unknown}")
    return {k: v for k, v in d.items() if k in names}
