"""Start the serving engine for `ninfer serve`: compile, load, warm up, wire the model service.

Called by `ninfer.commands.serve.build_state` before the listening socket opens, so a server
that accepts connections has a compiled plan, loaded weights and a warmed-up step loop.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from ninfer.api import oplog
from ninfer.api.config import kv_pool_warning
from ninfer.api.prompt_encoding import control_token_spellings
from ninfer.api.sampling import SamplerPolicy
from ninfer.api.service import ModelService, SamplerDefaults
from ninfer.api.state import ServerState
from ninfer.api.template import ChatTemplate, chat_template_for, load_builtin_template
from ninfer.artifact import Artifact
from ninfer.runtime.config import EngineConfig
from ninfer.runtime.engine import Engine
from ninfer.runtime.executors import make_executor
from ninfer.runtime.request import Request, SamplingParams
from ninfer.runtime.sampler import Sampler

log = logging.getLogger("ninfer.serve")


def load_template(config: Any, artifact: Artifact, tokenizer: Tokenizer) -> ChatTemplate:
    specials = {
        k: v
        for k, v in (
            ("bos_token", artifact.special_tokens.get("bos_token")),
            ("eos_token", artifact.special_tokens.get("eos_token")),
        )
        if isinstance(v, str)
    }
    if config.chat_template:
        source = Path(config.chat_template).read_text(encoding="utf-8")
        return chat_template_for(source, tokenizer, special_tokens=specials)
    if artifact.chat_template:
        return chat_template_for(artifact.chat_template, tokenizer, special_tokens=specials)
    log.warning(
        "the artifact has no chat template: using ninfer's built-in Qwen-style ChatML template"
    )
    return load_builtin_template(
        "qwen_xml", control_tokens=control_token_spellings(tokenizer), special_tokens=specials
    )


def eos_ids_of(artifact: Artifact, tokenizer: Tokenizer) -> tuple[int, ...]:
    ids = [i for i in artifact.special_tokens.get("eos_token_ids", []) if isinstance(i, int)]
    for text in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>"):
        tid = tokenizer.token_to_id(text)
        if tid is not None and tid not in ids and text == artifact.special_tokens.get("eos_token"):
            ids.append(tid)
    if not ids:
        tid = tokenizer.token_to_id("<|im_end|>")
        if tid is not None:
            ids.append(tid)
    return tuple(ids)


def start_engine(state: ServerState, artifact: Artifact) -> None:
    from ninfer.passes.pipeline import compile_artifact

    config = state.config
    t0 = time.monotonic()
    plan = compile_artifact(artifact, config.compile_options())
    executor = make_executor(plan, artifact, device=config.device)
    if warning := kv_pool_warning(config, executor.num_pages * executor.page_size):
        log.warning(warning)  # `auto` and the default resolve only here
    if hasattr(executor, "capture_all"):  # CUDA: capture every decode bucket before serving
        t_graphs = time.monotonic()
        graphs = executor.capture_all()
        log.info(
            "captured %d CUDA Graph decode buckets in %.1f s", graphs, time.monotonic() - t_graphs
        )
    log.info("plan compiled and weights loaded in %.1f s", time.monotonic() - t0)
    _log_plan(plan, executor)
    names = {f.name for f in dataclasses.fields(EngineConfig)}
    options = config.engine_options(names)
    options["page_size"] = executor.page_size
    options["kv_capacity"] = executor.num_pages * executor.page_size
    engine_config = EngineConfig(**options)
    tokenizer = Tokenizer.from_str(artifact.tokenizer_json)
    eos_ids = eos_ids_of(artifact, tokenizer)
    engine = Engine(engine_config, executor, Sampler(), eos_ids)
    template = load_template(config, artifact, tokenizer)
    service = ModelService(
        engine=engine,
        tokenizer=tokenizer,
        template=template,
        eos_ids=eos_ids,
        # a sequence never outgrows the KV pool: a smaller pool is the effective context
        max_context=min(config.max_context, executor.num_pages * executor.page_size),
        default_max_tokens=config.default_max_tokens,
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
    )
    t1 = time.monotonic()
    _warm_up(engine, tokenizer, engine_config.max_concurrency, engine_config.max_context)
    log.info("warm-up done in %.2f s", time.monotonic() - t1)
    state.engine = engine
    state.tokenizer = tokenizer
    state.template = template
    state.extra["service"] = service
    state.extra["artifact"] = artifact
    state.extra["memory"] = memory_layout(plan, executor)


def _log_plan(plan: Any, executor: Any) -> None:
    """--log-level debug: the startup resource planning (the plan's passes and fusions, its
    memory ledger against the budget, the KV pool and state slots as sized, the decode CUDA
    Graph buckets)."""
    if not log.isEnabledFor(logging.DEBUG):
        return
    mem = memory_layout(plan, executor)
    log.debug("plan: %d passes, fusions %s", len(plan.passes), plan.fusions or "none")
    budget = mem["budget_bytes"]
    log.debug("memory ledger (budget %s):", oplog.nbytes(budget) if budget else "unbounded")
    for e in mem["ledger"]:
        log.debug("  %-13s %10s  %s", e["item"], oplog.nbytes(e["bytes"]), e.get("detail", ""))
    kv = mem["kv"]
    log.debug(
        "KV pool: %d pages x %d tokens (%s, %s per page, %s in all)", kv["pages"],
        kv["page_size"], kv["dtype"], oplog.nbytes(kv["bytes_per_page"]), oplog.nbytes(kv["bytes"]),
    )  # fmt: skip
    st = mem["state_slots"]
    if st["slots"]:
        log.debug("state slots: %d x %s", st["slots"], oplog.nbytes(st["bytes_per_slot"]))
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


def memory_layout(plan: Any, executor: Any) -> dict[str, Any]:
    """The server_start record's `memory`: the plan's sizing ledger (what it budgeted, against
    which device budget), the one workspace allocation, the KV pool as the executor sized it
    (after `auto`), recurrent-state slots and the CUDA Graph buckets captured. No vision runtime
    exists, so `vision_workspace` is null (--vision is refused for every current artifact)."""
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
