"""Helpers of the speculative-decoding tests: engines built by the composition root on the tiny
fixtures, with and without `--spec draft` (the fixtures share one tokenizer, so any of them can
draft for another; a model drafting for itself is accepted almost always)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ninfer.artifact.format import Artifact
from ninfer.runtime.build import build_engine
from ninfer.runtime.config import EngineOptions
from ninfer.runtime.engine import Engine, EngineStats
from ninfer.runtime.request import Request, RequestOutput
from tests.runtime.real_engine import settled

T = 60.0  # seconds: a generous bound for any wait


def make_engine(target: Path, draft: Path | None, k: int = 4, **options) -> Engine:
    """An engine on `target` (float32 CPU, page 16); with `draft`, speculating with it."""
    options.setdefault("max_context", 512)
    options.setdefault("kv_capacity", 2048)
    options.setdefault("page_size", 16)
    options.setdefault("prefill_chunk", 64)
    options.setdefault("max_pending_requests", 64)
    if draft is not None:
        options.update(spec="draft", draft_model=str(draft), draft_tokens=k)
    return build_engine(Artifact(target), EngineOptions.of(**options))


def plain_and_spec(
    target: Path,
    draft: Path,
    requests: Callable[[], list[Request]],
    k: int = 4,
    **options: Any,
) -> tuple[list[RequestOutput], list[RequestOutput], EngineStats]:
    """`requests()` on a plain engine on `target`, then on one speculating with `draft` (the
    same `options`): (plain outputs, speculative outputs, the speculative engine's settled
    stats)."""
    with make_engine(target, None, **options) as plain:
        want = run(plain, requests())
    with make_engine(target, draft, k=k, **options) as spec:
        outs = run(spec, requests())
        stats = settled(spec)
    return want, outs, stats


def run(engine: Engine, requests: list[Request]) -> list[RequestOutput]:
    handles = [engine.submit(r) for r in requests]
    return [h.result(T) for h in handles]


def check_counters(
    outs: list[RequestOutput], stats: EngineStats, k: int, backend: str = "draft"
) -> None:
    """Per request drafted >= accepted and position counts in range; the sums are the global
    counters."""
    specs = [o.timings.speculative for o in outs]
    assert all(s is not None for s in specs)
    for s in specs:
        assert s["backend"] == backend and s["draft_window"] == k
        assert s["drafted_tokens"] >= s["accepted_tokens"] >= 0
        assert s["drafted_tokens"] <= k * s["rounds"]
        assert len(s["accepted_per_position"]) == k
        assert sum(s["accepted_per_position"]) == s["accepted_tokens"]
        assert all(
            a >= b for a, b in zip(s["accepted_per_position"], s["accepted_per_position"][1:])
        )
    assert stats.spec_decode_rounds_total == sum(s["rounds"] for s in specs)
    assert stats.spec_decode_draft_tokens_total == sum(s["drafted_tokens"] for s in specs)
    assert stats.spec_decode_accepted_tokens_total == sum(s["accepted_tokens"] for s in specs)
    assert stats.spec_decode_fallback_steps_total == sum(s["fallback_steps"] for s in specs)
    assert stats.spec_decode_draft_tokens_total >= stats.spec_decode_accepted_tokens_total
