"""`build_engine(artifact, options) -> Engine`: the one composition root.

    artifact ──compile_artifact(options.compile)──▶ plan ──make_executor──▶ executor
                                                                             │
    options, eos ids of the artifact's tokenizer, a Sampler ───────────────▶ Engine (started)

It is the only code that compiles a plan, loads an executor and starts an engine: `ninfer
serve` (api/server/engine.py), `ninfer.LLM` (llm.py) and `ninfer bench engine` all call it, so
the three run the same plan on the same engine loop. On CUDA every decode-batch CUDA Graph is
captured before it returns.

With `--tensor-parallel N` (N > 1) the plan and executor come from ninfer.parallel: every
rank's plan compiled here, N-1 worker processes, and rank 0's executor, which mirrors each
step to them; the engine, scheduler and sampler are the same.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from tokenizers import Tokenizer as _HFTokenizer

from ninfer.passes.pipeline import compile_artifact
from ninfer.runtime.config import EngineOptions
from ninfer.runtime.engine import Engine
from ninfer.runtime.executors.choose import make_executor
from ninfer.runtime.executors.sampler import Sampler
from ninfer.runtime.tokenizer import eos_token_ids
from ninfer.spec.build import build_speculator, target_compile_options

log = logging.getLogger("ninfer.engine")


def build_engine(
    artifact: Any,
    options: EngineOptions,
    *,
    on_fatal: Callable[[str], None] | None = None,
    ranks: Any = None,
) -> Engine:
    """Compile `artifact` (an `ninfer.artifact.Artifact`, or the bench's synthetic source)
    for `options.compile`, load its executor on `options.device` and start an engine.

    The engine's `plan` and `executor` are the ones built here; its KV pool is what the
    executor made (`kv_capacity="auto"` resolved). A source without a tokenizer (synthetic
    weights) has no EOS ids. Raises ConfigError for impossible options, ArtifactError for a
    model the planner cannot lower.

    Tensor parallelism only: `on_fatal(message)` is called from a watchdog thread when a rank
    dies or a collective fails (the engine cannot run any more; the server stops itself);
    `ranks` is a running ninfer.parallel.ranks.RankGroup to load onto (tests reuse one across
    models), None to start one that the engine stops when it closes.
    """
    t0 = time.monotonic()
    if options.compile.tensor_parallel > 1:
        from ninfer.parallel.engine import parallel_executor

        plan, executor = parallel_executor(artifact, options, ranks=ranks, on_fatal=on_fatal)
    else:
        plan = compile_artifact(artifact, target_compile_options(artifact, options))
        extra = {"collect_timings": True} if options.collect_timings else {}
        load = lambda: make_executor(plan, artifact, options.device, **extra)
        executor = _off_caller_thread(load) if options.device == "cpu" else load()
    if hasattr(executor, "capture_all"):  # CUDA: capture every decode bucket before serving
        t_graphs = time.monotonic()
        graphs = executor.capture_all()
        log.info(
            "captured %d CUDA Graph decode buckets in %.1f s", graphs, time.monotonic() - t_graphs
        )
    log.info("plan compiled and weights loaded in %.1f s", time.monotonic() - t0)
    tokenizer_json = getattr(artifact, "tokenizer_json", None)
    eos: tuple[int, ...] = ()
    if tokenizer_json:
        eos = eos_token_ids(artifact.special_tokens, _HFTokenizer.from_str(tokenizer_json))
    draft = lambda: build_speculator(artifact, options, executor)
    # --spec: its drafter (loaded like the executor), or None
    speculator = _off_caller_thread(draft) if options.device == "cpu" else draft()
    return Engine(options, executor, Sampler(), eos, plan=plan, speculator=speculator)


def _off_caller_thread(load: Callable[[], Any]) -> Any:
    """`load()` run on a short-lived thread (its exception re-raised here).

    On CPU, loading weights runs torch ops in OpenMP parallel regions, and OpenMP keeps a team
    of worker threads for every thread that opened one. The engine computes on its own
    thread; on a small machine a second, idle team of the caller's slows every step of the
    engine's team (2 cores, the demo model: 35 decode steps/s instead of 93). Loading on a
    thread that exits afterwards leaves the caller without a team of its own."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = load()
        except Exception as e:  # noqa: BLE001 - re-raised on the caller's thread
            box["error"] = e

    t = threading.Thread(target=run, name="ninfer-load")
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["value"]
