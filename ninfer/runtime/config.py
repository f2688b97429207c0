"""`EngineOptions`: every option of an engine, read once into one frozen, validated object.

    EngineOptions
    ├── compile: CompileOptions   what the planner decides on (device type, dtypes, lanes,
    │                             context, KV pool and pages, prefill chunk, CUDA Graphs, memory)
    └── the engine's own options  device index, pending queue and timeout, prefix reuse, the
                                  default output limit, host snapshot budget, overlap

`build_engine(artifact, options)` (build.py) is the only consumer that compiles, loads and
starts from it; `ninfer serve`, `ninfer.LLM` and `ninfer bench engine` each build one. Field
names follow the `ninfer serve` flags (`--max-concurrency` -> `max_concurrency`; the switch
`--no-cuda-graph` -> `cuda_graphs=False`) and defaults are the flags' defaults (docs/serving.md,
"Server options"). Each value is validated once, where it is declared: the compile fields by
`CompileOptions`, the rest here; errors are `ConfigError`s naming the flag.

No torch import: the scheduler and its tests build this object on any machine.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Self

from ninfer.errors import ConfigError
from ninfer.passes.options import MAX_VERIFY_ROWS, CompileOptions, int_range

MIB = 1 << 20
DEFAULT_HOST_CONTEXT_MIB = 8192  # --host-context-mib default: 8192 MiB ...
DEFAULT_HOST_STATE_IMAGES = 8  # ... plus this many recurrent-state images
NO_TIMEOUT_MS = 1 << 40  # the largest --pending-timeout-ms: waiting is never cut short

SPEC_ENGINE_BACKENDS = (None, "draft", "mtp", "dflash")  # speculative backends the engine runs
MAX_DRAFT_TOKENS = 15  # most draft tokens per round (a verify chunk of 16 tokens)

_COMPILE_FIELDS = frozenset(f.name for f in dataclasses.fields(CompileOptions))


class OutputLimit(NamedTuple):
    """A request's output limit and what sets it: "max_tokens" (asked for, or the default)
    or "context" (the room left in the context is smaller)."""

    max_tokens: int
    cause: str


@dataclass(frozen=True)
class EngineOptions:
    """Engine options. Construction validates and raises `ConfigError` with a one-line message.

    Units: every `*_ms` field is milliseconds, `*_mib` MiB; context sizes are tokens.
    """

    compile: CompileOptions = field(default_factory=CompileOptions)
    device_index: int | None = None  # the CUDA device ("cuda:N"); None on cpu, 0 on cuda
    max_pending_requests: int = 16  # requests allowed to wait behind the lanes
    pending_timeout_ms: int = 30000  # deadline from arrival to first admission
    prefix_reuse: bool = True  # cross-request prefix reuse (--no-prefix-reuse turns it off)
    default_max_tokens: int = 8192  # output limit when a request gives none
    admission_bypass: int = 4  # fresh requests that may pass a waiting head that cannot fit
    host_context_mib: int | None = None  # pause-snapshot host budget; None: default; 0: off
    overlap: bool = True  # launch the next decode step before reading this one's tokens
    collect_timings: bool = False  # CUDA: record per-step timings (ninfer bench)
    # speculative decoding (--spec, --draft-model, --draft-tokens): "draft" runs the separate
    # small model `draft_model` (a .ninfer path, same tokenizer) as the drafter; None: off
    spec: str | None = None
    draft_model: str | None = None
    draft_tokens: int = 4  # tokens proposed per round (k); the verify chunk is k + 1 tokens
    # --lm-head-draft: the drafter's logits use a reduced, frequency-ranked part of the lm_head
    # (ninfer/spec/draft_vocab.py); drafts are still verified by the full target
    lm_head_draft: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.compile, CompileOptions):
            raise ConfigError(f"compile must be CompileOptions, got {self.compile!r}")
        if self.compile.device == "cpu":
            if self.device_index is not None:
                raise ConfigError(f"--device cpu takes no device index, got {self.device_index}")
        elif self.device_index is None:
            object.__setattr__(self, "device_index", 0)
        else:
            int_range("device", self.device_index, 0, 1023)
        int_range("max_pending_requests", self.max_pending_requests, 0, 1 << 20)
        int_range("pending_timeout_ms", self.pending_timeout_ms, 1, NO_TIMEOUT_MS)
        int_range("default_max_tokens", self.default_max_tokens, 1, 1 << 24)
        int_range("admission_bypass", self.admission_bypass, 0, 1 << 20)
        if self.host_context_mib is not None:
            int_range("host_context_mib", self.host_context_mib, 0, 1 << 30)
        if self.spec not in SPEC_ENGINE_BACKENDS:
            raise ConfigError(
                f"--spec {self.spec}: the engine runs {', '.join(map(str, SPEC_ENGINE_BACKENDS[1:]))}"
            )
        if (self.spec == "draft") != (self.draft_model is not None):
            raise ConfigError("--spec draft and --draft-model ARTIFACT go together")
        int_range("draft_tokens", self.draft_tokens, 1, MAX_DRAFT_TOKENS)
        if self.spec is not None and self.compile.tensor_parallel > 1:
            raise ConfigError(
                f"--spec {self.spec} with --tensor-parallel: speculative rounds are not run on "
                "sharded engines in this build; drop one of them"
            )
        if self.lm_head_draft and self.spec not in ("mtp", "dflash"):
            raise ConfigError("--lm-head-draft requires --spec mtp or dflash in this build")
        if self.spec is not None:  # k more state slots per lane (hybrid models use them)
            spec_slots = self.compile.max_concurrency * self.draft_tokens
            rows = min(MAX_VERIFY_ROWS, self.compile.max_concurrency * (self.draft_tokens + 1))
            # the MTP head reads the target's hidden after the final norm at every position
            capture = ("final",) if self.spec == "mtp" else ()
            capture = self.compile.capture + tuple(
                c for c in capture if c not in self.compile.capture
            )
            compile_options = dataclasses.replace(
                self.compile, spec_state_slots=spec_slots, verify_rows=rows, capture=capture
            )
            object.__setattr__(self, "compile", compile_options)
        for name in ("prefix_reuse", "overlap", "collect_timings", "lm_head_draft"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")

    @classmethod
    def of(cls, **options: Any) -> Self:
        """Options from keywords named like the serve flags, compile and engine ones mixed
        (`EngineOptions.of(max_concurrency=2, prefix_reuse=False)`); `device` may name the
        index ("cuda:1"). An unknown keyword is a ConfigError listing the known ones."""
        engine_names = {f.name for f in dataclasses.fields(cls)} - {"compile", "device_index"}
        unknown = sorted(set(options) - _COMPILE_FIELDS - engine_names)
        if unknown:
            known = ", ".join(sorted(_COMPILE_FIELDS | engine_names))
            raise ConfigError(f"unknown engine option(s) {', '.join(unknown)} (known: {known})")
        compile_kw = {k: v for k, v in options.items() if k in _COMPILE_FIELDS}
        engine_kw = {k: v for k, v in options.items() if k in engine_names}
        device = compile_kw.get("device", "cpu")
        if isinstance(device, str) and device.startswith("cuda:"):
            index = device.removeprefix("cuda:")
            if not index.isdigit():
                raise ConfigError(f"--device {device}: expected cpu, cuda or cuda:N")
            compile_kw["device"], engine_kw["device_index"] = "cuda", int(index)
        return cls(compile=CompileOptions(**compile_kw), **engine_kw)

    # -- derived values -----------------------------------------------------------------------
    @property
    def device(self) -> str:
        """The torch device: "cpu" or "cuda:N"."""
        return "cpu" if self.compile.device == "cpu" else f"cuda:{self.device_index}"

    @property
    def dtype(self) -> str:
        """The activation dtype as --dtype spells it, resolved (float32 on cpu, bfloat16 on
        cuda when not given)."""
        return self.compile.dtype or ("float32" if self.compile.device == "cpu" else "bfloat16")

    @property
    def vision(self) -> bool:
        """Whether the plan runs the vision tower (--vision): requests may carry media."""
        return self.compile.vision

    @property
    def max_concurrency(self) -> int:
        return self.compile.max_concurrency

    @property
    def max_context(self) -> int:
        return self.compile.max_context

    @property
    def prefill_chunk(self) -> int:
        return self.compile.prefill_chunk

    @property
    def page_size(self) -> int:
        return self.compile.page_size

    @property
    def kv_tokens(self) -> int:
        """Tokens of the KV pool as asked (kv_capacity, or max_context when omitted or "auto":
        the executor resolves "auto" from device memory and reports the pool it made)."""
        kv = self.compile.kv_capacity
        return kv if isinstance(kv, int) else self.compile.max_context

    @property
    def num_pages(self) -> int:
        """Pages a pool of `kv_tokens` tokens needs."""
        return -(-self.kv_tokens // self.page_size)

    @property
    def num_state_slots(self) -> int:
        """Recurrent-state slots a hybrid model needs: one per lane plus the checkpoint extras."""
        return self.compile.state_slots

    def output_limit(
        self, prompt_len: int, max_tokens: int | None, pool_tokens: int
    ) -> OutputLimit:
        """The one place the output limit of a request is resolved: `max_tokens`, or
        `default_max_tokens` when None, at most the room left after the `prompt_len` prompt
        tokens in the context (max_context, or the KV pool's `pool_tokens` when smaller: a
        sequence never outgrows the pool), and at least 1."""
        room = min(self.max_context, pool_tokens) - prompt_len
        wanted = self.default_max_tokens if max_tokens is None else max_tokens
        return OutputLimit(max(1, min(wanted, room)), "max_tokens" if wanted <= room else "context")

    def host_context_bytes(self, state_bytes: int) -> int:
        """The host budget in bytes for an executor whose state image is `state_bytes` bytes:
        `host_context_mib` MiB, or by default 8192 MiB plus eight state images."""
        if self.host_context_mib is None:
            return DEFAULT_HOST_CONTEXT_MIB * MIB + DEFAULT_HOST_STATE_IMAGES * state_bytes
        return self.host_context_mib * MIB
