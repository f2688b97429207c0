"""The KV cache vocabulary: the `--kv-dtype` values and the storage format of K and of V each
stands for. Defined once here; the compile options, `ninfer serve`'s flags, the passes and both
executors import it.

    f32 bf16 f16   plain values in that dtype (f16 only as a cpu compute dtype's default)
    int8 fp8       one byte per value + an f32 scale per token and head
    nvfp4          e2m1 pairs + e4m3 scales per 16 values + an f32 scale per token and head
    k8v4           K as fp8, V as nvfp4
"""

from __future__ import annotations

KV_DTYPES = ("f32", "bf16", "int8", "fp8", "nvfp4", "k8v4")  # what --kv-dtype accepts
PLAIN_KV_FORMATS = ("f32", "bf16", "f16")  # storage formats that hold the values as they are
# storage formats the fused attention prologue (kernels/attn_prologue.py) writes; a KV dtype
# with K or V in another format keeps the unfused prologue launches
PROLOGUE_KV_FORMATS = (*PLAIN_KV_FORMATS, "int8", "fp8")


def split_kv(kv_dtype: str) -> tuple[str, str]:
    """Storage format of K and of V."""
    return ("fp8", "nvfp4") if kv_dtype == "k8v4" else (kv_dtype, kv_dtype)


def prologue_fuses(kv_dtype: str) -> bool:
    """Whether the one-launch attention prologue writes both K and V of this KV dtype."""
    return all(f in PROLOGUE_KV_FORMATS for f in split_kv(kv_dtype))
