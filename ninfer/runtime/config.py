"""The engine's options, read once into one frozen, validated object.

Fields are named like the `ninfer serve` flags (`--max-concurrency` -> `max_concurrency`) and
have the same defaults (docs/serving.md, "Server options"). Loading from argv or keywords
happens elsewhere; this file only states what a valid combination is.

No torch import: the scheduler and its tests build this object on any machine.
"""

from __future__ import annotations

from dataclasses import dataclass

from ninfer.errors import ConfigError

MAX_LANES = 8  # --max-concurrency is 1..8 by contract
MIB = 1 << 20
DEFAULT_HOST_CONTEXT_MIB = 8192  # --host-context-mib default: 8192 MiB ...
DEFAULT_HOST_STATE_IMAGES = 8  # ... plus this many recurrent-state images


@dataclass(frozen=True)
class EngineConfig:
    """Engine options. Construction validates and raises `ConfigError` with a one-line message.

    Units: every `*_ms` field is milliseconds; context sizes are tokens.
    """

    max_concurrency: int = 1  # resident execution lanes, 1..8
    max_pending_requests: int = 16  # requests allowed to wait behind the lanes
    pending_timeout_ms: int = 30000  # deadline from arrival to first admission
    prefill_chunk: int = 1024  # prefill tokens computed per step (all prefilling requests)
    max_context: int = 8192  # logical ceiling of each sequence (prompt + output)
    kv_capacity: int | None = None  # shared KV pool in tokens; None follows max_context
    page_size: int = 16  # tokens per KV page
    device_state_slots: int | None = None  # extra state slots for checkpoints; None = lanes
    prefix_reuse: bool = True  # cross-request prefix reuse (--no-prefix-reuse turns it off)
    default_max_tokens: int = 8192  # output limit when a request gives none
    admission_bypass: int = 4  # fresh requests that may pass a waiting head that cannot fit
    host_context_mib: int | None = None  # pause-snapshot host budget; None: default; 0: off

    def __post_init__(self) -> None:
        _check_range("max_concurrency", self.max_concurrency, 1, MAX_LANES)
        _check_range("max_pending_requests", self.max_pending_requests, 0, 1 << 20)
        _check_range("pending_timeout_ms", self.pending_timeout_ms, 1, 1 << 40)
        _check_range("prefill_chunk", self.prefill_chunk, 1, 1 << 24)
        _check_range("max_context", self.max_context, 2, 1 << 24)
        _check_range("page_size", self.page_size, 1, 4096)
        _check_range("default_max_tokens", self.default_max_tokens, 1, 1 << 24)
        _check_range("admission_bypass", self.admission_bypass, 0, 1 << 20)
        if self.kv_capacity is not None:
            _check_range("kv_capacity", self.kv_capacity, self.page_size, 1 << 30)
        if self.device_state_slots is not None:
            _check_range("device_state_slots", self.device_state_slots, 0, 1024)
        if self.host_context_mib is not None:
            _check_range("host_context_mib", self.host_context_mib, 0, 1 << 30)
        if not isinstance(self.prefix_reuse, bool):
            raise ConfigError(f"prefix_reuse must be true or false, got {self.prefix_reuse!r}")

    @property
    def kv_tokens(self) -> int:
        """Token capacity of the shared KV pool (kv_capacity, or max_context when omitted)."""
        return self.kv_capacity if self.kv_capacity is not None else self.max_context

    @property
    def num_pages(self) -> int:
        """Pages the KV pool needs to hold `kv_tokens` tokens."""
        return -(-self.kv_tokens // self.page_size)

    @property
    def extra_state_slots(self) -> int:
        """State slots beyond the lanes, used for prefix checkpoints (hybrid models)."""
        return self.max_concurrency if self.device_state_slots is None else self.device_state_slots

    @property
    def num_state_slots(self) -> int:
        """Total recurrent-state slots a hybrid model needs: one per lane plus the extras."""
        return self.max_concurrency + self.extra_state_slots

    def host_context_bytes(self, state_bytes: int) -> int:
        """The host budget in bytes for an executor whose state image is `state_bytes` bytes:
        `host_context_mib` MiB, or by default 8192 MiB plus eight state images."""
        if self.host_context_mib is None:
            return DEFAULT_HOST_CONTEXT_MIB * MIB + DEFAULT_HOST_STATE_IMAGES * state_bytes
        return self.host_context_mib * MIB


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _check_range(name: str, value: object, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} ({_flag(name)}) must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise ConfigError(f"{name} ({_flag(name)}) must be in {lo}..{hi}, got {value}")
