"""`ninfer serve` options, read once into one frozen, validated object.

Fields are named like the flags (`--log-level` -> `log_level`) and default to the executable
defaults of docs/serving.md, "Server options"; the engine's flags form `engine`, the
`EngineOptions` (ninfer/runtime/config.py) that `build_engine` takes. Construction validates
every value and every combination that can be judged without the artifact, raising
`ConfigError` with a one-line message naming the flag; `check_capabilities` judges the rest once the artifact's
components are known. `model_context_warning` and `kv_pool_warning` word what startup logs
for context limits it serves but cannot fully honour. Parsing argv lives in
`ninfer/commands/serve.py`; no I/O happens here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ninfer.api.service.sampling import FIELDS
from ninfer.errors import ConfigError
from ninfer.runtime.config import EngineOptions

LOG_LEVELS = ("trace", "debug", "info", "warning", "error", "critical", "off")
SPEC_BACKENDS = ("mtp", "dflash", "dflash2", "draft")  # draft: a separate model (--draft-model)
DTYPES = ("float32", "bfloat16")
# Draft tokens per speculative round each backend accepts (inclusive).
DRAFT_TOKEN_RANGE = {"mtp": (1, 5), "dflash": (1, 15), "dflash2": (1, 15), "draft": (1, 15)}
# The artifact component each optional capability needs (--spec draft brings its own model).
SPEC_COMPONENT = {"mtp": "mtp", "dflash": "dflash", "dflash2": "dflash2"}
TOP_K_MAX = 20


@dataclass(frozen=True)
class ServeConfig:
    """Every `ninfer serve` option: the server's own (network, access, protocol defaults,
    media, logging, storage) and `engine`, the `EngineOptions` that `build_engine` takes
    (--device, --dtype, --max-context, --kv-capacity, --max-concurrency, --max-pending-requests,
    --pending-timeout-ms, --prefill-chunk, --kv-dtype, --no-cuda-graph, --no-prefix-reuse,
    --device-state-slots, --host-context-mib, --default-max-tokens), validated there.

    Units: `*_ms` milliseconds, `*_mib` MiB. Sampler overrides are None when not given.
    """

    artifact: str | None = None  # None: the embedded demo model
    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None
    model_id: str | None = None  # None: artifact metadata.name, else its architecture
    engine: EngineOptions = field(default_factory=EngineOptions)
    log_stats_interval_ms: int = 5000  # 0 disables the throughput report
    log_level: str = "info"
    context_cost_presets: str | None = None
    max_request_mib: int = 384
    client_timeout_s: float = 30.0  # idle / slow-header connections closed, slow bodies 408
    media_cache_mib: int = 1024
    media_live_mib: int = 2048
    media_preprocess_threads: int = 0  # 0: min(16, host concurrency)
    media_allow_private: bool = False  # media URLs may reach loopback / private networks
    request_log_jsonl: str | None = None
    response_store_max_records: int = 1024
    response_store_max_mib: int = 256
    spec: str | None = None
    draft_model: str | None = None  # --draft-model: the --spec draft model (a path)
    draft_tokens: int | None = None
    lm_head_draft: bool = False
    default_thinking_budget: int | None = None
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
    reasoning_key_file: str | None = None  # key of Responses reasoning tokens (reasoning_seal)

    def __post_init__(self) -> None:
        if not self.host:
            raise ConfigError("--host must not be empty")
        _int("port", self.port, 0, 65535)
        if self.api_key is not None and not self.api_key:
            raise ConfigError("--api-key must not be empty")
        if self.model_id is not None and not self.model_id.strip():
            raise ConfigError("--model-id must not be empty")
        if not isinstance(self.engine, EngineOptions):
            raise ConfigError(f"engine must be EngineOptions, got {self.engine!r}")
        _int("log_stats_interval_ms", self.log_stats_interval_ms, 0, 1 << 40)
        _choice("log_level", self.log_level, LOG_LEVELS)
        _int("max_request_mib", self.max_request_mib, 1, 1 << 20)
        _float("client_timeout_s", self.client_timeout_s, 0.001, 86400.0)
        _int("media_cache_mib", self.media_cache_mib, 0, 1 << 24)
        _int("media_live_mib", self.media_live_mib, 1, 1 << 24)
        _int("media_preprocess_threads", self.media_preprocess_threads, 0, 1024)
        _int("response_store_max_records", self.response_store_max_records, 0, 1 << 30)
        _int("response_store_max_mib", self.response_store_max_mib, 0, 1 << 24)
        if self.spec is not None:
            _choice("spec", self.spec, SPEC_BACKENDS)
        if self.draft_tokens is not None:
            if self.spec is None:
                raise ConfigError("--draft-tokens requires --spec mtp|dflash|dflash2|draft")
            lo, hi = DRAFT_TOKEN_RANGE[self.spec]
            _int(
                "draft_tokens",
                self.draft_tokens,
                lo,
                hi,
                what=f"in {lo}..{hi} for --spec {self.spec}",
            )
        if self.lm_head_draft and self.spec in (None, "draft"):
            raise ConfigError("--lm-head-draft requires --spec mtp|dflash|dflash2")
        if (self.spec == "draft") != (self.draft_model is not None):
            raise ConfigError(
                "--spec draft needs --draft-model ARTIFACT, and --draft-model needs --spec draft"
            )
        if (self.spec == "draft") != (self.engine.spec == "draft"):
            raise ConfigError(
                f"--spec {self.spec}: the engine options say spec={self.engine.spec!r}"
            )
        if self.default_thinking_budget is not None:
            _int(
                "default_thinking_budget",
                self.default_thinking_budget,
                1,
                1 << 24,
                what="a positive integer",
            )
        _float("temperature", self.temperature, 0.0, 2.0)
        _float("top_p", self.top_p, 0.0, 1.0)  # 0 is argmax (api/service/sampling.py)
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
            "media_allow_private",
            "thinking",
            "preserve_thinking",
            "cors",
            "greedy",
        ):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")

    # -- derived values -----------------------------------------------------------------------
    @property
    def vision(self) -> bool:
        """--vision: an engine option (the plan runs the vision tower), read here by the
        protocol layer, which accepts media only then."""
        return self.engine.vision

    @property
    def max_request_bytes(self) -> int:
        """The raw body limit in bytes (--max-request-mib)."""
        return self.max_request_mib * 1024 * 1024

    def public_model_id(self, artifact_name: str) -> str:
        """The model id advertised and accepted over HTTP: --model-id, else the artifact's
        metadata.name (which `Artifact.name` already falls back to the architecture for)."""
        return self.model_id if self.model_id is not None else artifact_name

    def sampler_overrides(self) -> dict[str, Any]:
        """Process-level sampler overrides that were given (request fields override these;
        --greedy then forces temperature 0)."""
        names = (*FIELDS, "seed")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}


def check_capabilities(config: ServeConfig, components: list[str] | tuple[str, ...]) -> None:
    """Refuse options that need an artifact component the artifact lacks.

    `components` is `Artifact.components` (e.g. ["text", "mtp", "vision"]). Raises ConfigError
    with one line naming the option, the missing component and what to do.
    """
    have = set(components)
    if config.spec in SPEC_COMPONENT and SPEC_COMPONENT[config.spec] not in have:
        raise ConfigError(
            f"--spec {config.spec} needs the artifact's {SPEC_COMPONENT[config.spec]} component, but it has only "
            f"{', '.join(components)}; drop --spec or convert a checkpoint with those weights"
        )
    if config.vision and "vision" not in have:
        raise ConfigError(
            f"--vision needs the artifact's vision component, but it has only {', '.join(components)}; "
            "drop --vision or convert a checkpoint with a vision tower"
        )
    if config.media_allow_private and not config.vision:
        raise ConfigError("--media-allow-private applies to media fetches: it needs --vision")


def check_vision_plan(config: ServeConfig, declared: Mapping[str, Any]) -> None:
    """Refuse --vision when the compiled plan does not execute the artifact's vision tower
    (`declared`: the plan's model["declared"], components present but not executed)."""
    if config.vision and "vision" in declared:
        raise ConfigError(
            f"--vision: the compiled plan does not run this artifact's vision tower "
            f"({declared['vision']}), so media input cannot be served; drop --vision (text "
            "requests use the same artifact)"
        )


def kv_pool_warning(config: ServeConfig, kv_tokens: int) -> str | None:
    """What startup logs when the KV pool (`kv_tokens`, as the engine resolved --kv-capacity)
    cannot hold one --max-context sequence: docs/serving.md lets the two be set apart, and a prompt
    longer than the pool is then refused per request (400, naming --kv-capacity); vLLM refuses
    such a pool at startup instead. None when the pool holds one."""
    max_context, kv_capacity = config.engine.max_context, config.engine.compile.kv_capacity
    if kv_tokens >= max_context:
        return None
    given = kv_capacity if kv_capacity is not None else "omitted"
    return (
        f"--kv-capacity {given} gives a KV pool of {kv_tokens} tokens, smaller than --max-context "
        f"{max_context}: prompts longer than {kv_tokens} tokens will be refused; raise "
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
    Not refused: the default (8192) is fixed, whatever the model. None when within."""
    limit = trained_context(model_config)
    max_context = config.engine.max_context
    if limit is None or max_context <= limit:
        return None
    source = f"max_position_embeddings {model_config['max_position_embeddings']}"
    if limit != model_config["max_position_embeddings"]:
        source += " with its rope scaling"
    return (
        f"--max-context {max_context} exceeds the model's trained context length of "
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
