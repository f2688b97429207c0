"""The server_start record of the request log (ninfer.api.observability.request_log; fields documented in
docs/request-log.md): the artifact served with its prefill signature, the context-cost
coefficients and their sources (ninfer.api.observability.context_cost), the engine's resolved
configuration, host-context budget and the environment (package versions, redacted argv)."""

from __future__ import annotations

import dataclasses
import os
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from ninfer.api.observability import context_cost
from ninfer.api.observability.request_log import redact_argv
from ninfer.api.service.media_prompt import MAX_VISION_TOKENS

CONTEXT_COST_KEY = "context_cost"  # state.extra: the ContextCost resolved at startup


def resolve_context_cost(state: Any, artifact: Any) -> context_cost.ContextCost:
    """Resolve the context-cost coefficients once (after the plan is built: the signature uses
    its resolved KV dtype) and keep them in state.extra. Raises ConfigError for a malformed
    --context-cost-presets file."""
    cfg = state.config
    presets = (
        context_cost.load_presets(cfg.context_cost_presets)
        if cfg.context_cost_presets is not None
        else None
    )
    inputs = _signature_inputs(state, artifact)
    cost = context_cost.resolve(
        context_cost.hardware_name(cfg.engine.device),
        context_cost.prefill_signature(inputs),
        presets,
    )
    state.extra[CONTEXT_COST_KEY] = cost
    return cost


def _signature_inputs(state: Any, artifact: Any) -> dict[str, Any]:
    cfg = state.config
    memory = state.extra.get("memory") or {}
    return context_cost.signature_inputs(
        artifact,
        device=cfg.engine.device,
        dtype=cfg.engine.dtype,
        kv_dtype=(memory.get("kv") or {}).get("dtype") or cfg.engine.compile.kv_dtype,
        prefill_chunk=cfg.engine.prefill_chunk,
        vision=cfg.vision,
        spec=cfg.spec,
    )


def server_start_fields(state: Any, artifact: Any, argv: list[str] | None = None) -> dict[str, Any]:
    """The server_start record of `state` (after the engine started) serving `artifact`."""
    cfg = state.config
    engine = state.engine
    snap = engine.snapshot() if engine is not None else None
    executor = getattr(engine, "executor", None)
    opts = cfg.engine
    service = state.extra.get("service")
    tensors = getattr(artifact, "tensors", {}) or {}
    memory = state.extra.get("memory") or {}
    cost = state.extra.get(CONTEXT_COST_KEY) or resolve_context_cost(state, artifact)
    return {
        "artifact": {
            "path": str(Path(artifact.path).resolve()),
            "architecture": artifact.architecture,
            "name": artifact.name,
            "components": list(artifact.components),
            "formats": sorted({info.format for info in tensors.values()}),
            "prefill_signature": cost.signature,
            "prefill_signature_inputs": _signature_inputs(state, artifact),
        },
        "context_cost": cost.record(),
        "public_model_id": state.model_id,
        "engine": {
            "device": opts.device,
            "dtype": opts.dtype,
            # as resolved (the flag's default depends on the device): the plan's KV dtype
            "kv_dtype": (memory.get("kv") or {}).get("dtype") or opts.compile.kv_dtype,
            "max_concurrency": opts.max_concurrency,
            "max_pending_requests": opts.max_pending_requests,
            "pending_timeout_ms": opts.pending_timeout_ms,
            "max_context": opts.max_context,
            "prefill_chunk": opts.prefill_chunk,
            "page_size": getattr(executor, "page_size", None),
            # the pool as the executor made it (`--kv-capacity auto` resolved)
            "kv_capacity_tokens": executor.num_pages * executor.page_size
            if executor is not None
            else None,
            "kv_pages": snap.kv_pages_capacity if snap is not None else None,
            "state_slots": snap.state_slots_capacity if snap is not None else None,
            "prefix_reuse": opts.prefix_reuse,
            "cuda_graph": opts.compile.cuda_graphs and opts.device.startswith("cuda"),
            "spec": cfg.spec,
            "draft_tokens": opts.draft_tokens if opts.spec else cfg.draft_tokens,  # k in effect
            "vision": cfg.vision,
        },
        "sampler": {
            "defaults": dataclasses.asdict(service.sampler_defaults)
            if service is not None
            else None,
            # what a request that sets no sampler field gets, per resolved thinking mode
            # (registered preset or generation defaults, then the process flags)
            **{
                mode: service.sampler_policy.resolve(thinking, {}) if service is not None else None
                for mode, thinking in (("thinking", True), ("non_thinking", False))
            },
            "process_overrides": cfg.sampler_overrides(),
            "greedy": cfg.greedy,
        },
        "thinking": {
            "enabled_by_default": cfg.thinking,
            "preserve_thinking": cfg.preserve_thinking,
            "default_thinking_budget": cfg.default_thinking_budget,
        },
        "default_max_tokens": opts.default_max_tokens,
        "media": _media(state),
        "memory": state.extra.get("memory"),
        "host_context": _host_context(state),
        "environment": _environment(cfg),
        "pid": os.getpid(),
        "argv": redact_argv(list(sys.argv if argv is None else argv)),
    }


def _media(state: Any) -> dict[str, Any] | None:
    """The media path as resolved at startup (null without --vision): the budgets, the worker
    count, the fetch policy and limits, the preparation permits, the preprocessing settings
    and the per-prompt vision-token envelope."""
    media = state.extra.get("media")
    if media is None:
        return None
    cfg, preparer = state.config, media.preparer
    limits = preparer.fetcher.limits
    return {
        "cache_mib": cfg.media_cache_mib,
        "live_mib": cfg.media_live_mib,
        "preprocess_threads": preparer.pool.threads,
        "allow_private": preparer.fetcher.policy.allow_private,
        "fetch_limits": dataclasses.asdict(limits),
        "preparation_permits": preparer.gate.permits,
        "preprocess": dataclasses.asdict(preparer.config),
        "max_vision_tokens": MAX_VISION_TOKENS,
    }


def _host_context(state: Any) -> dict[str, Any] | None:
    """Host snapshot backing: capacity and occupancy from the engine's published snapshot."""
    engine = getattr(state, "engine", None)
    snap = engine.snapshot() if engine is not None else None
    if snap is None or not hasattr(snap, "host_context_capacity_bytes"):
        return None
    return {
        "capacity_bytes": snap.host_context_capacity_bytes,
        "used_bytes": snap.host_context_used_bytes,
        "reserved_bytes": snap.host_context_reserved_bytes,
        "peak_bytes": snap.host_context_peak_bytes,
    }


def _environment(cfg: Any) -> dict[str, Any]:
    import platform

    env: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform()}
    try:
        import torch

        env["torch"] = torch.__version__
        if cfg.engine.device_index is not None and torch.cuda.is_available():
            env["gpu"] = torch.cuda.get_device_name(cfg.engine.device_index)
            env["cuda"] = torch.version.cuda
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    try:
        env["ninfer"] = version("ninfer")
    except PackageNotFoundError:  # not installed as a distribution (a source checkout)
        env["ninfer"] = None
    return env
