"""Start the serving engine for `ninfer serve`: build it, wire the model service, warm up.

Called by `ninfer.commands.serve.build_state` before the listening socket opens, so a server
that accepts connections has a compiled plan, loaded weights and a warmed-up step loop.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import time
from typing import Any

from tokenizers import Tokenizer

from ninfer.api.server.config import check_vision_plan, kv_pool_warning
from ninfer.api.server.state import ServerState
from ninfer.api.service.body_screen import BodyScreen, ScreenSetup
from ninfer.api.service.media_path import build_media_path
from ninfer.api.service.model_service import ModelService
from ninfer.api.service.sampling import SamplerDefaults, SamplerPolicy
from ninfer.api.service.template import artifact_template
from ninfer.artifact import Artifact
from ninfer.constrain import TokenizerInfo
from ninfer.runtime.build import build_engine
from ninfer.runtime.config import EngineOptions
from ninfer.runtime.engine import Engine
from ninfer.runtime.request import Request, SamplingParams
from ninfer.units import nbytes

log = logging.getLogger("ninfer.serve")


def start_engine(state: ServerState, artifact: Artifact, resolver: Any = None) -> None:
    """Build the engine (`build_engine`: plan, executor, CUDA Graphs), wire the model service
    around it (with the media path under --vision; `resolver` replaces DNS for media fetches,
    in tests), warm it up, and put both on `state`."""
    config = state.config
    engine = build_engine(artifact, config.engine, on_fatal=_stop_server)
    plan, executor = engine.plan, engine.executor
    try:
        check_vision_plan(config, plan.model.get("declared") or {})
    except BaseException:
        engine.close()
        raise
    pool_tokens = executor.num_pages * executor.page_size
    if warning := kv_pool_warning(config, pool_tokens):
        log.warning(warning)  # `auto` and the default resolve only here
    log.info("%s", plan_summary(config.engine, memory_layout(plan, executor)))
    _log_plan(plan, executor)
    tokenizer = Tokenizer.from_str(artifact.tokenizer_json)
    template = artifact_template(artifact, tokenizer, config.chat_template)
    try:
        media = build_media_path(config, artifact, tokenizer, resolver) if config.vision else None
    except BaseException:
        engine.close()
        raise
    service = ModelService(
        engine=engine,
        tokenizer=tokenizer,
        template=template,
        eos_ids=engine.eos_ids,
        # a sequence never outgrows the KV pool: a smaller pool is the effective context
        max_context=min(config.engine.max_context, pool_tokens),
        sampler_defaults=SamplerDefaults.resolve(
            artifact.generation, dict(config.sampler_overrides(), greedy=config.greedy)
        ),
        sampler_policy=SamplerPolicy(
            artifact.architecture,
            dict(artifact.generation),
            config.sampler_overrides(),
            config.greedy,
        ),
        default_thinking_budget=config.default_thinking_budget,
        media=media,
        tokenizer_info=lambda: TokenizerInfo.from_artifact(artifact),
    )
    service.body_screen = BodyScreen(
        ScreenSetup(
            tokenizer_json=artifact.tokenizer_json,
            template_source=template.source,
            control_tokens=template.control_tokens,
            special_tokens=template.special_tokens,
            max_context=service.max_context,
            state=ServerState(config=config, model_id=state.model_id),
        )
    )  # its worker process starts with the first large body
    t1 = time.monotonic()
    _warm_up(engine, tokenizer, config.engine.max_concurrency, config.engine.max_context)
    log.info("warm-up done in %.2f s", time.monotonic() - t1)
    state.engine = engine
    state.tokenizer = tokenizer
    state.template = template
    state.extra["service"] = service
    state.extra["artifact"] = artifact
    state.extra["memory"] = memory_layout(plan, executor)
    state.extra["media"] = media


def _stop_server(message: str) -> None:
    """A tensor-parallel rank died (or a collective failed): the engine cannot run any more, so
    the server stops (SIGTERM to itself: a graceful stop, the engine closed, the remaining
    ranks stopped) rather than answer every request with an error or hang."""
    log.critical("stopping the server: %s", message)
    os.kill(os.getpid(), signal.SIGTERM)


def _log_plan(plan: Any, executor: Any) -> None:
    """--log-level debug: the startup resource planning (the plan's passes and fusions, its
    memory ledger against the budget, the KV pool and state slots as sized, the decode CUDA
    Graph buckets)."""
    if not log.isEnabledFor(logging.DEBUG):
        return
    mem = memory_layout(plan, executor)
    log.debug("plan: %d passes, fusions %s", len(plan.passes), plan.fusions or "none")
    budget = mem["budget_bytes"]
    log.debug("memory ledger (budget %s):", nbytes(budget) if budget else "unbounded")
    for e in mem["ledger"]:
        log.debug("  %-13s %10s  %s", e["item"], nbytes(e["bytes"]), e.get("detail", ""))
    kv = mem["kv"]
    log.debug(
        "KV pool: %d pages x %d tokens (%s, %s per page, %s in all)", kv["pages"],
        kv["page_size"], kv["dtype"], nbytes(kv["bytes_per_page"]), nbytes(kv["bytes"]),
    )  # fmt: skip
    st = mem["state_slots"]
    if st["slots"]:
        log.debug("state slots: %d x %s", st["slots"], nbytes(st["bytes_per_slot"]))
    log.debug("decode CUDA Graph buckets: %s", mem["cuda_graphs"]["buckets"] or "none")


def _warm_up(engine: Engine, tokenizer: Tokenizer, max_concurrency: int, max_context: int) -> None:
    """Run real steps before the socket opens so that no request pays a first call: one request
    alone (one-chunk prefill, batch-1 decode), then up to two together with prompts of different
    lengths (a multi-chunk prefill step and a batch-2 decode). GPU kernels are compiled per shape
    class (a count of 1, a multiple of 16, anything else), and a first compile costs ~1 s."""
    hello = tokenizer.encode("Hello", add_special_tokens=False).ids or [0]

    def request(ids: list[int]) -> Request:
        ids = ids[: max(1, max_context - 2)]  # room for the two output tokens
        return Request(tuple(ids), SamplingParams(max_tokens=2, temperature=0.0), session_key=None)

    engine.submit(request(hello)).result(timeout=600)
    pending = [
        engine.submit(request(hello * n)) for n in (3, 16)[: max(1, min(2, max_concurrency))]
    ]
    for handle in pending:
        handle.result(timeout=600)


def plan_summary(options: EngineOptions, memory: dict[str, Any]) -> str:
    """One startup line saying what was planned: device and dtype, lanes, context, the KV pool
    and the memory the plan budgets (`--log-level debug` shows the full ledger); with tensor
    parallelism these are rank 0's (each rank holds its part of the weights and KV heads)."""
    kv = memory["kv"]
    planned = {e["item"]: e["bytes"] for e in memory["ledger"]}
    n = options.compile.tensor_parallel
    what = f"plan (each of {n} tensor-parallel ranks)" if n > 1 else "plan"
    return (
        f"{what}: {options.device} {options.dtype}, {options.max_concurrency} lane(s), context "
        f"{options.max_context}, KV pool {kv['capacity_tokens']} tokens ({kv['dtype']}, "
        f"{nbytes(kv['bytes'])}), weights {nbytes(planned.get('weights', 0))}, "
        f"total {nbytes(memory['ledger_total_bytes'] or 0)}"
    )


def memory_layout(plan: Any, executor: Any) -> dict[str, Any]:
    """The server_start record's `memory`: the plan's sizing ledger (what it budgeted, against
    which device budget), the one workspace allocation, the KV pool as the executor sized it
    (after `auto`), recurrent-state slots and the CUDA Graph buckets captured.
    `vision_workspace` is null: with --vision the tower's encode shares the one workspace, which
    the plan sizes as the larger of a step and one vision encode (the ledger's workspace row)."""
    entries = [dataclasses.asdict(e) for e in plan.ledger.entries]
    planned = {e["item"]: e["bytes"] for e in entries}
    per_page = plan.kv.bytes_per_page
    pages = int(executor.num_pages)
    return {
        "budget_bytes": plan.ledger.budget,
        "ledger": entries,
        "ledger_total_bytes": plan.ledger.total,
        "workspace": {"capacity_bytes": int(planned.get("workspace", 0))},
        "vision_workspace": None,
        "kv": {
            "dtype": plan.kv.dtype,
            "page_size": int(executor.page_size),
            "bytes_per_page": per_page,
            "pages": pages,
            "capacity_tokens": pages * int(executor.page_size),
            "bytes": pages * per_page,
        },
        "state_slots": {
            "slots": plan.state.slots,
            "bytes_per_slot": plan.state.bytes_per_slot,
        },
        "cuda_graphs": {"buckets": sorted(getattr(executor, "graph_buckets", ()) or ())},
    }
