"""`ninfer serve` options, read once into one frozen, validated object.

Fields are named like the flags (`--max-concurrency` -> `max_concurrency`) and default to the
executable defaults of spec/serving.md, "Server options". Construction validates every value and
every combination that can be judged without the artifact, raising `ConfigError` with a
one-line message naming the flag; `check_capabilities` judges the rest once the artifact's
components are known. `model_context_warning` and `kv_pool_warning` word what startup logs
for context limits it serves but cannot fully honour. Parsing argv lives in
`ninfer/commands/serve.py`; no I/O happens here.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ninfer.errors import ConfigError

LOG_LEVELS = ("trace", "debug", "info", "warning", "error", "critical", "off")
KV_DTYPES = ("bf16", "int8", "fp8", "nvfp4", "k8v4")
SPEC_BACKENDS = ("mtp", "dflash", "dflash2")
DTYPES = ("float32", "bfloat16")
MAX_LANES = 8
# Draft tokens per speculative round each backend accepts (inclusive).
DRAFT_TOKEN_RANGE = {"mtp": (1, 5), "dflash": (1, 15), "dflash2": (1, 15)}
# The artifact component each optional capability needs.
SPEC_COMPONENT = {"mtp": "mtp", "dflash": "dflash", "dflash2": "dflash2"}
TOP_K_MAX = 20

_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")


@dataclass(frozen=True)
class ServeConfig:
    """Every `ninfer serve` option. Units: `*_ms` milliseconds, `*_mib` MiB, contexts tokens.

    `device` is resolved: "cpu" or "cuda:N". `kv_dtype` None is the spec default bf16 on cuda
    and the compute dtype on cpu (where bf16 KV would only lose precision against the
    float32 reference), as `CompileOptions` resolves it. `kv_capacity` is tokens, "auto" (fill the device
    memory left after weights and workspaces, keeping 1 GiB headroom; resolved by the engine
    at startup) or None (follow max_context). Sampler overrides are None when not given.
    """

    artifact: str | None = None  # None: the embedded demo model
    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None
    model_id: str | None = None  # None: artifact metadata.name, else its architecture
    max_context: int = 8192
    kv_capacity: int | str | None = None
    max_concurrency: int = 1
    max_pending_requests: int = 16
    pending_timeout_ms: int = 30000
    prefill_chunk: int = 1024
    log_stats_interval_ms: int = 5000  # 0 disables the throughput report
    log_level: str = "info"
    device: str = "cpu"
    dtype: str = "float32"
    context_cost_presets: str | None = None
    max_request_mib: int = 384
    client_timeout_s: float = 30.0  # idle / slow-header connections closed, slow bodies 408
    media_cache_mib: int = 1024
    media_live_mib: int = 2048
    media_preprocess_threads: int = 0  # 0: min(16, host concurrency)
    request_log_jsonl: str | None = None
    response_store_max_records: int = 1024
    response_store_max_mib: int = 256
    kv_dtype: str | None = None  # None: bf16 on cuda, the compute dtype on cpu
    spec: str | None = None
    draft_tokens: int | None = None
    lm_head_draft: bool = False
    default_max_tokens: int = 8192
    default_thinking_budget: int | None = None
    vision: bool = False
    cuda_graph: bool = True  # --no-cuda-graph
    prefix_reuse: bool = True  # --no-prefix-reuse
    device_state_slots: int | None = None  # None: max_concurrency
    host_context_mib: int | None = None  # None: 8192 MiB + 8 model state images
    thinking: bool = True  # --no-thinking turns the default off
    preserve_thinking: bool = False
    cors: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    greedy: bool = False
    chat_template: str | None = None  # path of a Jinja template file

    def __post_init__(self) -> None:
        if not self.host:
            raise ConfigError("--host must not be empty")
        _int("port", self.port, 0, 65535)
        if self.api_key is not None and not self.api_key:
            raise ConfigError("--api-key must not be empty")
        if self.model_id is not None and not self.model_id.strip():
            raise ConfigError("--model-id must not be empty")
        _int("max_context", self.max_context, 2, 1 << 24)
        if self.kv_capacity != "auto" and self.kv_capacity is not None:
            _int("kv_capacity", self.kv_capacity, 1, 1 << 30, what="a positive integer or auto")
        _int("max_concurrency", self.max_concurrency, 1, MAX_LANES)
        _int("max_pending_requests", self.max_pending_requests, 0, 1 << 20)
        _int("pending_timeout_ms", self.pending_timeout_ms, 1, 1 << 40)
        _int("prefill_chunk", self.prefill_chunk, 1, 1 << 24)
        _int("log_stats_interval_ms", self.log_stats_interval_ms, 0, 1 << 40)
        _choice("log_level", self.log_level, LOG_LEVELS)
        if not _DEVICE.match(self.device):
            raise ConfigError(
                f"--device must be cpu, cuda, cuda:N or a CUDA index N, got {self.device!r}"
            )
        _choice("dtype", self.dtype, DTYPES)
        _int("max_request_mib", self.max_request_mib, 1, 1 << 20)
        _float("client_timeout_s", self.client_timeout_s, 0.001, 86400.0)
        _int("media_cache_mib", self.media_cache_mib, 0, 1 << 24)
        _int("media_live_mib", self.media_live_mib, 1, 1 << 24)
        _int("media_preprocess_threads", self.media_preprocess_threads, 0, 1024)
        _int("response_store_max_records", self.response_store_max_records, 0, 1 << 30)
        _int("response_store_max_mib", self.response_store_max_mib, 0, 1 << 24)
        if self.kv_dtype is not None:
            _choice("kv_dtype", self.kv_dtype, KV_DTYPES)
        if self.spec is not None:
            _choice("spec", self.spec, SPEC_BACKENDS)
        if self.draft_tokens is not None:
            if self.spec is None:
                raise ConfigError("--draft-tokens requires --spec mtp|dflash|dflash2")
            lo, hi = DRAFT_TOKEN_RANGE[self.spec]
            _int(
                "draft_tokens",
                self.draft_tokens,
                lo,
                hi,
                what=f"in {lo}..{hi} for --spec {self.spec}",
            )
        if self.lm_head_draft and self.spec is None:
            raise ConfigError("--lm-head-draft requires --spec mtp|dflash|dflash2")
        _int("default_max_tokens", self.default_max_tokens, 1, 1 << 24)
        if self.default_thinking_budget is not None:
            _int(
                "default_thinking_budget",
                self.default_thinking_budget,
                1,
                1 << 24,
                what="a positive integer",
            )
        if self.device_state_slots is not None:
            _int("device_state_slots", self.device_state_slots, 0, 1024)
        if self.host_context_mib is not None:
            _int("host_context_mib", self.host_context_mib, 0, 1 << 30)
        _float("temperature", self.temperature, 0.0, 2.0)
        _float("top_p", self.top_p, 0.0, 1.0)  # 0 is argmax, as in a request (api/sampling.py)
        if self.top_k is not None:
            _int(
                "top_k",
                self.top_k,
                0,
                TOP_K_MAX,
                what=f"in 0..{TOP_K_MAX} (0 selects the top-20 cap)",
            )
        _float("min_p", self.min_p, 0.0, 1.0)
        _float("presence_penalty", self.presence_penalty, -2.0, 2.0)
        _float("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        if self.seed is not None:
            _int("seed", self.seed, -(1 << 63), (1 << 63) - 1, what="a signed 64-bit integer")
        for name in (
            "lm_head_draft",
            "vision",
            "cuda_graph",
            "prefix_reuse",
            "thinking",
            "preserve_thinking",
            "cors",
            "greedy",
        ):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")

    # -- derived values -----------------------------------------------------------------------
    @property
    def max_request_bytes(self) -> int:
        """The raw body limit in bytes (--max-request-mib)."""
        return self.max_request_mib * 1024 * 1024

    @property
    def device_type(self) -> str:
        """ "cpu" or "cuda"."""
        return self.device.split(":")[0]

    @property
    def device_index(self) -> int | None:
        """The CUDA device index, None on cpu."""
        return int(self.device.split(":")[1]) if self.device.startswith("cuda:") else None

    @property
    def kv_auto(self) -> bool:
        return self.kv_capacity == "auto"

    def public_model_id(self, artifact_name: str) -> str:
        """The model id advertised and accepted over HTTP: --model-id, else the artifact's
        metadata.name (which `Artifact.name` already falls back to the architecture for)."""
        return self.model_id if self.model_id is not None else artifact_name

    def sampler_overrides(self) -> dict[str, Any]:
        """Process-level sampler overrides that were given (request fields override these;
        --greedy then forces temperature 0)."""
        names = (
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "presence_penalty",
            "frequency_penalty",
            "seed",
        )
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}

    def engine_options(self, field_names: set[str] | None = None) -> dict[str, Any]:
        """The options that share a name with an engine config field, as keywords.

        `field_names` restricts the result (pass `{f.name for f in dataclasses.fields(EngineConfig)}`);
        `kv_capacity="auto"` is left out because only the engine, knowing device memory, can
        resolve it. `prefix_reuse`, `cuda_graph` keep their positive spelling.
        """
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if self.kv_auto:
            del out["kv_capacity"]
        if field_names is not None:
            out = {k: v for k, v in out.items() if k in field_names}
        return out

    def compile_options(self) -> Any:
        """The `ninfer.passes.options.CompileOptions` these flags select (planner inputs)."""
        from ninfer.passes.options import CompileOptions

        return CompileOptions(
            device=self.device_type,
            dtype=self.dtype,
            kv_dtype=self.kv_dtype,
            max_concurrency=self.max_concurrency,
            max_context=self.max_context,
            kv_capacity=self.kv_capacity,
            prefill_chunk=self.prefill_chunk,
            device_state_slots=self.device_state_slots,
            cuda_graphs=self.cuda_graph,
        )


def check_capabilities(config: ServeConfig, components: list[str] | tuple[str, ...]) -> None:
    """Refuse options that need an artifact component the artifact lacks.

    `components` is `Artifact.components` (e.g. ["text", "mtp", "vision"]). Raises ConfigError
    with one line naming the option, the missing component and what to do.
    """
    have = set(components)
    if config.spec is not None and SPEC_COMPONENT[config.spec] not in have:
        raise ConfigError(
            f"--spec {config.spec} needs the artifact's {SPEC_COMPONENT[config.spec]} component, but it has only "
            f"{', '.join(components)}; drop --spec or convert a checkpoint with those weights"
        )
    if config.vision and "vision" not in have:
        raise ConfigError(
            f"--vision needs the artifact's vision component, but it has only {', '.join(components)}; "
            "drop --vision or convert a checkpoint with a vision tower"
        )
    if config.vision:  # the weights convert, but nothing here encodes an image yet
        raise ConfigError(
            "--vision: this build of ninfer has no vision encoder runtime, so media input cannot "
            "be served; drop --vision (text requests use the same artifact)"
        )


def kv_pool_warning(config: ServeConfig, kv_tokens: int) -> str | None:
    """What startup logs when the KV pool (`kv_tokens`, as the engine resolved --kv-capacity)
    cannot hold one --max-context sequence: the spec lets the two be set apart, and a prompt
    longer than the pool is then refused per request (400, naming --kv-capacity); vLLM refuses
    such a pool at startup instead. None when the pool holds one."""
    if kv_tokens >= config.max_context:
        return None
    given = config.kv_capacity if config.kv_capacity is not None else "omitted"
    return (
        f"--kv-capacity {given} gives a KV pool of {kv_tokens} tokens, smaller than --max-context "
        f"{config.max_context}: prompts longer than {kv_tokens} tokens will be refused; raise "
        f"--kv-capacity or lower --max-context to {kv_tokens} to match"
    )


def trained_context(model_config: Mapping[str, Any]) -> int | None:
    """The longest context the model supports, in tokens, as vLLM derives it: the config's
    max_position_embeddings, extended by a linear or YaRN rope-scaling factor (YaRN: factor x
    original_max_position_embeddings). None when the config does not give it."""
    base = model_config.get("max_position_embeddings")
    if isinstance(base, bool) or not isinstance(base, int) or base <= 0:
        return None
    rope: dict[str, Any] = {}
    for key in ("rope_scaling", "rope_parameters"):
        if isinstance(model_config.get(key), dict):
            rope.update(model_config[key])
    kind = rope.get("rope_type", rope.get("type"))
    factor = rope.get("factor")
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or factor <= 1:
        return base
    if kind == "yarn":
        original = rope.get("original_max_position_embeddings") or model_config.get(
            "original_max_position_embeddings"
        )
        return max(base, int((original or base) * factor))
    if kind == "linear":
        return int(base * factor)
    return base


def model_context_warning(config: ServeConfig, model_config: Mapping[str, Any]) -> str | None:
    """What startup logs when --max-context exceeds the model's trained context
    (`trained_context` of the artifact's config), as llama.cpp's server warns when its context
    exceeds n_ctx_train: positions the model never saw are served, and their output degrades.
    Not refused: the spec's default (8192) is fixed, whatever the model. None when within."""
    limit = trained_context(model_config)
    if limit is None or config.max_context <= limit:
        return None
    source = f"max_position_embeddings {model_config['max_position_embeddings']}"
    if limit != model_config["max_position_embeddings"]:
        source += " with its rope scaling"
    return (
        f"--max-context {config.max_context} exceeds the model's trained context length of "
        f"{limit} tokens ({source} in the artifact's config): output past {limit} tokens "
        f"degrades; use --max-context {limit} to stay within it"
    )


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _int(name: str, value: object, lo: int, hi: int, what: str | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ConfigError(
            f"{_flag(name)} must be {what or f'an integer in {lo}..{hi}'}, got {value!r}"
        )


def _float(name: str, value: object, lo: float, hi: float) -> None:
    if value is None:
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not lo <= value <= hi
    ):
        raise ConfigError(f"{_flag(name)} must be a number in [{lo:g}, {hi:g}], got {value!r}")


def _choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{_flag(name)} must be one of {'|'.join(choices)}, got {value!r}")
