"""Context-cost coefficients: what moving a context between host and device costs (transfer)
and what recomputing it costs (prefill), resolved once at startup.

    transfer   host_to_device_gb_per_s, device_to_host_gb_per_s     per hardware
    prefill    seconds(T) = ms_per_chunk/1e3 · chunks + ms_per_token/1e3 · T
                            + ms_per_token_squared/1e3 · T²          per hardware + signature

Sources, each part resolved on its own: the generic defaults below; then compiled values (the
table ninfer ships: empty until measured presets are committed, never a guess presented as a
measurement); then entries of `--context-cost-presets FILE` that match. A transfer entry
matches the hardware; a prefill entry matches the hardware and the prefill signature, so a new
model representation (other shapes, weight formats, dtypes, chunking or components) without a
matching measurement keeps the generic prefill coefficients. The operational `context cost`
record and the request log's server_start name the source of each part.

The prefill signature (`pf1-` and 16 hex digits) is a digest of what prefill cost depends on:
the Text configuration (architecture and config.json numbers, token ids left out), the Vision
configuration (null: no vision runtime exists), the bindings (device kind, compute and KV
dtypes, weight storage formats, prefill chunk) and the Uses (components in use: text, and the
speculative backend when one runs). server_start records it with its inputs, so a presets file
can be written for it.

File format (JSON; any other member or type is refused and aborts startup):

    {"transfer": [{"hardware": "NVIDIA H200", "host_to_device_gb_per_s": 50.0,
                   "device_to_host_gb_per_s": 50.0}],
     "prefill":  [{"hardware": "NVIDIA H200", "signature": "pf1-0123456789abcdef",
                   "ms_per_token": 0.02, "ms_per_token_squared": 0.0, "ms_per_chunk": 1.5}]}
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ninfer.errors import ConfigError

FLAG = "--context-cost-presets"
TRANSFER_FIELDS = ("host_to_device_gb_per_s", "device_to_host_gb_per_s")
PREFILL_FIELDS = ("ms_per_token", "ms_per_token_squared", "ms_per_chunk")


@dataclass(frozen=True)
class TransferCost:
    host_to_device_gb_per_s: float
    device_to_host_gb_per_s: float


@dataclass(frozen=True)
class PrefillCost:
    ms_per_token: float
    ms_per_token_squared: float
    ms_per_chunk: float


# Generic defaults: order-of-magnitude placeholders used until a measurement matches (a PCIe
# class host link; a mid-size model's prefill). They are labelled "generic" wherever reported.
GENERIC_TRANSFER = TransferCost(host_to_device_gb_per_s=10.0, device_to_host_gb_per_s=10.0)
GENERIC_PREFILL = PrefillCost(ms_per_token=0.1, ms_per_token_squared=0.0, ms_per_chunk=1.0)
# Compiled values, by hardware (transfer) and (hardware, signature) (prefill): none measured yet.
COMPILED_TRANSFER: dict[str, TransferCost] = {}
COMPILED_PREFILL: dict[tuple[str, str], PrefillCost] = {}


@dataclass(frozen=True)
class Presets:
    """A validated presets file: transfer by hardware, prefill by (hardware, signature)."""

    path: str
    transfer: dict[str, TransferCost]
    prefill: dict[tuple[str, str], PrefillCost]


@dataclass(frozen=True)
class ContextCost:
    """The resolved coefficients and where each part came from: "generic", "compiled" or
    "file:PATH" (the presets file)."""

    hardware: str
    signature: str
    transfer: TransferCost
    transfer_source: str
    prefill: PrefillCost
    prefill_source: str

    def record(self) -> dict[str, Any]:
        """The server_start `context_cost` object."""
        return {
            "hardware": self.hardware,
            "prefill_signature": self.signature,
            "transfer": {"source": self.transfer_source, **asdict(self.transfer)},
            "prefill": {"source": self.prefill_source, **asdict(self.prefill)},
        }

    def summary(self) -> str:
        """The operational stderr record."""
        return (
            f"context cost: transfer from {self.transfer_source}, prefill from "
            f"{self.prefill_source} (hardware {self.hardware!r}, signature {self.signature})"
        )


def _number(entry: dict[str, Any], key: str, where: str) -> float:
    value = entry.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}.{key}: expected a number, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"{where}.{key}: expected a finite number >= 0, got {value!r}")
    return float(value)


def _entries(data: dict[str, Any], section: str, where: str) -> list[dict[str, Any]]:
    entries = data.get(section, [])
    if not isinstance(entries, list):
        raise ConfigError(f"{where}: {section}: expected an array of entries")
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: {section}[{i}]: expected an object")
    return entries


def _check_keys(entry: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
    for key in entry:
        if key not in allowed:
            raise ConfigError(f"{where}: unknown member {key!r} (expected {', '.join(allowed)})")
    hardware = entry.get("hardware")
    if not isinstance(hardware, str) or not hardware:
        raise ConfigError(f"{where}.hardware: expected a non-empty string")


def load_presets(path: str | Path) -> Presets:
    """Read and validate a presets file. Raises ConfigError naming the file and the member
    (unreadable, not JSON, wrong shape, a duplicate entry)."""
    where = f"{FLAG} {path}"
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"{where}: cannot read ({e.strerror})") from None
    except ValueError as e:
        raise ConfigError(f"{where}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a JSON object with 'transfer' and/or 'prefill'")
    for key in data:
        if key not in ("transfer", "prefill"):
            raise ConfigError(f"{where}: unknown member {key!r} (expected transfer, prefill)")
    transfer: dict[str, TransferCost] = {}
    for i, entry in enumerate(_entries(data, "transfer", where)):
        at = f"{where}: transfer[{i}]"
        _check_keys(entry, ("hardware", *TRANSFER_FIELDS), at)
        if entry["hardware"] in transfer:
            raise ConfigError(f"{at}: a second entry for hardware {entry['hardware']!r}")
        transfer[entry["hardware"]] = TransferCost(
            *(_number(entry, k, at) for k in TRANSFER_FIELDS)
        )
    prefill: dict[tuple[str, str], PrefillCost] = {}
    for i, entry in enumerate(_entries(data, "prefill", where)):
        at = f"{where}: prefill[{i}]"
        _check_keys(entry, ("hardware", "signature", *PREFILL_FIELDS), at)
        signature = entry.get("signature")
        if not isinstance(signature, str) or not signature:
            raise ConfigError(f"{at}.signature: expected a non-empty string")
        key = (entry["hardware"], signature)
        if key in prefill:
            raise ConfigError(f"{at}: a second entry for hardware {key[0]!r}, signature {key[1]}")
        prefill[key] = PrefillCost(*(_number(entry, k, at) for k in PREFILL_FIELDS))
    return Presets(str(path), transfer, prefill)


def signature_inputs(
    artifact: Any,
    *,
    device: str,
    dtype: str,
    kv_dtype: str | None,
    prefill_chunk: int,
    vision: bool,
    spec: str | None,
) -> dict[str, Any]:
    """What the prefill signature digests (module docstring)."""
    config = {
        k: v for k, v in sorted((artifact.config or {}).items()) if not k.endswith("token_id")
    }
    tensors = getattr(artifact, "tensors", {}) or {}
    return {
        "text": {"architecture": artifact.architecture, "config": config},
        "vision": None,  # no vision runtime: --vision is refused for every current artifact
        "bindings": {
            "device": device.split(":")[0],
            "dtype": dtype,
            "kv_dtype": kv_dtype,
            "weight_formats": sorted({info.format for info in tensors.values()}),
            "prefill_chunk": prefill_chunk,
        },
        "uses": ["text"] + (["vision"] if vision else []) + ([spec] if spec else []),
    }


def prefill_signature(inputs: dict[str, Any]) -> str:
    canon = json.dumps(inputs, sort_keys=True, separators=(",", ":"), default=str)
    return "pf1-" + hashlib.sha256(canon.encode()).hexdigest()[:16]


def hardware_name(device: str) -> str:
    """The hardware a preset names: the GPU's name, or "cpu" and the processor model."""
    if device.startswith("cuda"):
        import torch

        index = int(device.split(":")[1]) if ":" in device else 0
        return torch.cuda.get_device_name(index)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return "cpu: " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return "cpu: " + (platform.processor() or platform.machine() or "unknown")


def resolve(hardware: str, signature: str, presets: Presets | None) -> ContextCost:
    """The coefficients for this hardware and signature (module docstring: sources)."""
    transfer, t_source = GENERIC_TRANSFER, "generic"
    prefill, p_source = GENERIC_PREFILL, "generic"
    if hardware in COMPILED_TRANSFER:
        transfer, t_source = COMPILED_TRANSFER[hardware], "compiled"
    if (hardware, signature) in COMPILED_PREFILL:
        prefill, p_source = COMPILED_PREFILL[hardware, signature], "compiled"
    if presets is not None:
        if hardware in presets.transfer:
            transfer, t_source = presets.transfer[hardware], f"file:{presets.path}"
        if (hardware, signature) in presets.prefill:
            prefill, p_source = presets.prefill[hardware, signature], f"file:{presets.path}"
    return ContextCost(hardware, signature, transfer, t_source, prefill, p_source)
