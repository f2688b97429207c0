"""Engine host overhead per decode step, on CPU with a tiny fixture model.

    .venv/bin/python bench/engine_overhead.py [--arch qwen3] [--batches 1,8] [--runs 5]
                                              [--decode-steps 64] [--out FILE]

For each batch size B, an engine with --max-concurrency B serves B greedy requests at once
(prompt 32 tokens, ignore_eos, max_tokens = decode steps + 1). The executor object is wrapped
so every `run` call is timed; a *steady decode step* is a batch of exactly B one-token rows.
Between two consecutive steady decode steps the engine worker does everything that is not the
model: sampling, commit, publishing events, stats, scheduling the next batch. So, per step:

    step_us       time from one run() start to the next run() start
    executor_us   time inside run() (the model, torch ops)
    overhead_us   step_us - executor_us: engine host overhead (sampler included)
    sampler_us    the part of overhead_us spent in Sampler.sample (argmax for greedy rows)

Medians over the steady steps of one run, then the median over --runs runs (a fresh engine each
run, one warm-up run first). Not a timed test: a number for later work to track. Timings use
time.perf_counter on the engine's worker thread; torch runs with one intra-op thread.
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import shlex
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # `artifacts` (fixture builders) is a top-level folder

import torch

from artifacts.fixtures import ARCHS, build_fixture
from ninfer.runtime.config import EngineOptions
from ninfer.runtime.engine import Engine
from ninfer.runtime.executors.cpu.executor import Executor, executor_for
from ninfer.runtime.executors.sampler import Sampler
from ninfer.runtime.request import Request, SamplingParams
from ninfer.runtime.step import StepBatch

PROMPT_LEN = 32
WIDTHS = (5, 9, 11, 11, 17, 10, 10)  # report columns


class TimedExecutor:
    """Delegates to a real Executor and records (start, seconds, decode rows) of every run()
    whose batch is pure decode (every chunk one token, no state copies)."""

    def __init__(self, inner: Executor) -> None:
        self.inner = inner
        self.num_pages = inner.num_pages
        self.page_size = inner.page_size
        self.num_state_slots = inner.num_state_slots
        self.is_hybrid = inner.is_hybrid
        self.records: list[
            tuple[float, float, int]
        ] = []  # (start_s, run_s, rows); rows 0: not decode
        self._lock = threading.Lock()

    def run(self, batch: StepBatch) -> Any:
        t0 = time.perf_counter()
        out = self.inner.run(batch)
        t1 = time.perf_counter()
        decode = not batch.state_copies and all(len(c.token_ids) == 1 for c in batch.chunks)
        with self._lock:
            self.records.append((t0, t1 - t0, len(batch.chunks) if decode else 0))
        return out

    def copy_state(self, src_slot: int, dst_slot: int) -> None:
        self.inner.copy_state(src_slot, dst_slot)


class TimedSampler(Sampler):
    """The real sampler, timing each `sample` call; keyed by the index of the executor run
    whose logits it samples (the engine samples right after each run that returns rows)."""

    def __init__(self, executor: TimedExecutor) -> None:
        super().__init__()
        self.executor = executor
        self.seconds: dict[int, float] = {}

    def sample(self, logits: Any, rows: Any) -> list[int]:
        t0 = time.perf_counter()
        out = super().sample(logits, rows)
        self.seconds[len(self.executor.records) - 1] = time.perf_counter() - t0
        return out


def one_run(ex: Executor, batch: int, decode_steps: int, seed: int) -> dict[str, float]:
    """Serve `batch` requests on a fresh engine; medians (µs) over the steady decode steps."""
    timed = TimedExecutor(ex)
    sampler = TimedSampler(timed)
    config = EngineOptions.of(
        max_concurrency=batch,
        max_context=ex.num_pages * ex.page_size,
        kv_capacity=ex.num_pages * ex.page_size,
        page_size=ex.page_size,
        prefix_reuse=False,  # every run computes the same work
    )
    params = SamplingParams(max_tokens=decode_steps + 1, temperature=0.0, ignore_eos=True)
    g = torch.Generator().manual_seed(seed)
    prompts = [
        torch.randint(0, ex.vocab_size, (PROMPT_LEN,), generator=g).tolist() for _ in range(batch)
    ]
    with Engine(config, timed, sampler, eos_ids=()) as engine:  # type: ignore[arg-type]
        handles = [engine.submit(Request(tuple(p), params)) for p in prompts]
        for h in handles:
            h.result(600)
    steps, runs, samples = [], [], []
    rec = timed.records
    for i, ((t0, run_s, rows), (t1, _, next_rows)) in enumerate(itertools.pairwise(rec)):
        if rows == batch and next_rows == batch:  # consecutive full decode steps
            steps.append(t1 - t0)
            runs.append(run_s)
            samples.append(sampler.seconds[i])
    if not steps:
        raise SystemExit(f"batch {batch}: no two consecutive full decode steps were seen")
    step, run = statistics.median(steps), statistics.median(runs)
    overhead = statistics.median(s - r for s, r in zip(steps, runs))
    sample = statistics.median(samples)
    return {
        "step_us": step * 1e6,
        "executor_us": run * 1e6,
        "overhead_us": overhead * 1e6,
        "sampler_us": sample * 1e6,
        "n": len(steps),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--arch", default="qwen3", choices=ARCHS, help="tiny fixture model (default qwen3)"
    )
    ap.add_argument("--batches", default="1,8", help="comma-separated batch sizes (default 1,8)")
    ap.add_argument("--runs", type=int, default=5, help="measured runs per batch size (default 5)")
    ap.add_argument(
        "--decode-steps", type=int, default=64, help="decode steps per run (default 64)"
    )
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    ap.add_argument(
        "--fixture-dir", default=os.path.join(tempfile.gettempdir(), "ninfer-bench-fixtures")
    )
    ap.add_argument("--out", help="also write the report to this file")
    args = ap.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    torch.set_num_threads(args.threads)

    root = Path(args.fixture_dir)
    root.mkdir(parents=True, exist_ok=True)
    path = build_fixture(args.arch, root)
    ctx = -(-(PROMPT_LEN + args.decode_steps + 2) // 16) * 16
    ex = executor_for(
        str(path), max_concurrency=max(batches), max_context=ctx, kv_capacity=max(batches) * ctx
    )

    rows = []
    for b in batches:
        one_run(ex, b, args.decode_steps, seed=0)  # warm-up
        results = [one_run(ex, b, args.decode_steps, seed=r + 1) for r in range(args.runs)]
        med = {
            k: statistics.median(r[k] for r in results)
            for k in ("step_us", "executor_us", "overhead_us", "sampler_us")
        }
        spread = [r["overhead_us"] for r in results]
        rows.append((b, med, min(spread), max(spread), results[0]["n"]))

    command = "python " + " ".join(
        shlex.quote(a) for a in [os.path.relpath(__file__, REPO), *(argv or sys.argv[1:])]
    )
    host = platform.processor() or platform.platform()
    model = f"{args.arch} fixture (hidden 64, vocab 512), float32, cpu, torch {torch.__version__}"
    header = ("batch", "step_us", "executor_us", "overhead_us", "overhead_min..max", "overhead %")
    lines = [
        "# engine host overhead per decode step (CPU, tiny fixture)",
        f"command:  {command}",
        f"model:    {model}, {args.threads} thread(s)",
        (
            f"host:     {platform.machine()} {host}, {os.cpu_count()} cpus, python"
            f" {platform.python_version()}, load average {os.getloadavg()[0]:.2f} at the end"
        ),
        (
            f"method:   {args.runs} runs x {args.decode_steps} decode steps, prompt {PROMPT_LEN};"
            " median over steady decode steps, then over runs"
        ),
        "",
        "  ".join(f"{h:>{w}}" for h, w in zip((*header, "sampler_us"), WIDTHS, strict=True)),
    ]
    for b, med, lo, hi, _ in rows:
        pct = 100.0 * med["overhead_us"] / med["step_us"]
        lines.append(
            f"{b:>5}  {med['step_us']:>9.1f}  {med['executor_us']:>11.1f}  {med['overhead_us']:>11.1f}"
            f"  {f'{lo:.1f}..{hi:.1f}':>17}  {pct:>9.1f}%  {med['sampler_us']:>10.1f}"
        )
    report = "\n".join(lines) + "\n"
    print(report, end="")
    if args.out:
        Path(args.out).write_text(report, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
