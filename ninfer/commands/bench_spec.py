"""`ninfer bench engine ARTIFACT --spec draft --draft-model DRAFT [--draft-tokens K]` (or
`--spec mtp [--lm-head-draft]`: the artifact's MTP head; `--spec dflash`: its DFlash
drafter): what speculative decoding buys on this machine, plain and speculative engines in
the same run.

    for each batch size b: the same prompts (random tokens, or --prompts FILE: one user message
    per line, rendered with the target's chat template), greedy, through
      1. the plain engine (build_engine, no --spec)        -> output tok/s
      2. the speculative engine (--spec draft)             -> output tok/s, rounds, drafts
    and, on the target's executor with the engines idle, the cost of one step of b rows:
      decode   1 token per row                             t1
      verify   k + 1 tokens per row, k + 1 logits rows     t_verify   (the verify plan variant)

Reported: acceptance length tau = committed tokens per round (accepted drafts + 1), the
acceptance rate per draft position (rounds whose draft i was accepted / rounds), the verify
cost ratio t_verify / t1, the drafter's cost per round (its wall time / rounds, and over t1),
the projected speed-up tau / (verify ratio + drafter ratio), and the measured one (speculative
over plain tok/s). Greedy outputs of both engines are compared token for token.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from ninfer.errors import ConfigError


def render_prompts(artifact: Any, path: str) -> list[list[int]]:
    """Token ids of each non-empty line of `path` as a user message with the artifact's chat
    template (the prompt a Chat Completions request with that message gets)."""
    from tokenizers import Tokenizer

    from ninfer.api.service.prompt_encoding import PromptEncoder
    from ninfer.api.service.template import artifact_template
    from ninfer.api.service.template_options import resolve_template_options

    lines = [x.strip() for x in Path(path).read_text(encoding="utf-8").splitlines() if x.strip()]
    if not lines:
        raise ConfigError(f"--prompts {path}: no prompt in it (one user message per line)")
    hf = Tokenizer.from_str(artifact.tokenizer_json)
    template = artifact_template(artifact, hf)
    encoder = PromptEncoder(hf, template.control_tokens)
    options = resolve_template_options(chat_template_kwargs=None)
    out = []
    for line in lines:
        r = template.render([{"role": "user", "content": line}], tools=None,
                            add_generation_prompt=True, continue_final_message=False,
                            options=options)  # fmt: skip
        out.append(encoder.encode(r.text, r.special_spans))
    return out


def _run(engine: Any, prompts: list[list[int]], output_len: int) -> tuple[float, list[Any]]:
    from ninfer.runtime.request import Request, SamplingParams

    params = SamplingParams(max_tokens=output_len, temperature=0.0)
    t0 = time.perf_counter()
    handles = [engine.submit(Request(tuple(p), params)) for p in prompts]
    outs = [h.result() for h in handles]
    return time.perf_counter() - t0, outs


def step_cost(ex: Any, rows: int, tokens: int, context: int, reps: int) -> float:
    """Median seconds of one step of `rows` chunks of `tokens` tokens each at position
    `context` (every position's logits: a verify chunk when tokens > 1; a hybrid model's rows
    read and write lane slots, without round slots), on pages the idle engine is not using.
    CUDA steps are timed to completion (synchronised)."""
    import torch

    from ninfer.runtime.step import SeqChunk, StepBatch

    ps = ex.page_size
    per = -(-(context + tokens) // ps)
    if per * rows > ex.num_pages:
        raise ConfigError(
            f"the KV pool ({ex.num_pages} pages) cannot hold {rows} rows of {context + tokens}"
        )
    chunks = tuple(
        SeqChunk(i, (1,) * tokens, context, tuple(range(i * per, (i + 1) * per)),
                 i if ex.is_hybrid else None, True, tokens)
        for i in range(rows)
    )  # fmt: skip
    batch = StepBatch(chunks)
    cuda = str(getattr(ex, "device", "cpu")).startswith("cuda")
    times = []
    for rep in range(reps + 1):  # the first is a warm-up
        t0 = time.perf_counter()
        ex.run(batch)
        if cuda:
            torch.cuda.synchronize()
        if rep:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run_verify_cost(args: argparse.Namespace) -> dict[str, Any]:
    """`--spec verify (ARTIFACT | --synthetic NAME)`: only the verify/decode step cost ratio,
    for k + 1 = 2 .. --draft-tokens + 1 tokens per row and each batch size, on an artifact or
    on random weights of a real shape (no drafter: what the GPU needs measured before any
    drafter exists)."""
    from ninfer.bench.synthetic import build_synthetic
    from ninfer.runtime.build import build_engine
    from ninfer.runtime.config import EngineOptions

    if (args.artifact is None) == (args.synthetic is None):
        raise ConfigError("--spec verify: give an ARTIFACT or --synthetic NAME (not both)")
    device = args.device or "cuda"
    if args.synthetic is not None:
        source, _ = build_synthetic(
            args.synthetic, args.weights, device, args.seed, args.quantize_lm_head
        )
    else:
        from ninfer.artifact import Artifact

        source = Artifact(args.artifact)
    from ninfer.passes.options import MAX_VERIFY_ROWS

    k, maxb, page = args.draft_tokens, max(args.batch_sizes), args.page_size
    ctx = -(-(args.input_len + k + 2) // page) * page
    engine = build_engine(
        source,
        EngineOptions.of(
            device=device,
            dtype=args.dtype,
            max_concurrency=maxb,
            max_context=ctx,
            kv_capacity=maxb * ctx,
            page_size=page,
            prefix_reuse=False,
            cuda_graphs=not args.no_cuda_graph,
            verify_rows=min(MAX_VERIFY_ROWS, maxb * (k + 1)),
        ),
    )  # fmt: skip (the verify steps' graph buckets, as a speculating engine's plan has them)
    rows = []
    try:
        ex = engine.executor
        for b in args.batch_sizes:
            t1 = step_cost(ex, b, 1, args.input_len, args.reps)
            for n in range(2, k + 2):
                tv = step_cost(ex, b, n, args.input_len, args.reps)
                rows.append({"batch": b, "verify_tokens": n, "decode_step_s": t1,
                             "verify_step_s": tv, "verify_ratio": tv / t1})  # fmt: skip
    finally:
        engine.close()
    name = args.synthetic or engine.plan.name
    return {"mode": "engine-spec-verify", "model": name, "weights": args.weights,
            "device": device, "context": args.input_len, "results": rows}  # fmt: skip


def format_verify_report(report: dict[str, Any]) -> str:
    lines = [
        (
            f"verify step cost: {report['model']} ({report['weights']}, {report['device']}),"
            f" context {report['context']} tokens"
        ),
        "batch  k+1  decode ms  verify ms  verify/decode",
    ]
    for r in report["results"]:
        lines.append(
            f"{r['batch']:>5} {r['verify_tokens']:>4} {r['decode_step_s'] * 1e3:10.3f}"
            f" {r['verify_step_s'] * 1e3:10.3f} {r['verify_ratio']:14.2f}"
        )
    return "\n".join(lines)


def run_spec_bench(args: argparse.Namespace) -> dict[str, Any]:
    from ninfer.artifact import Artifact
    from ninfer.artifact.cache import servable_path
    from ninfer.ir.models import check_tensors
    from ninfer.runtime.build import build_engine
    from ninfer.runtime.config import NO_TIMEOUT_MS, EngineOptions

    mtp = args.spec == "mtp"
    own = args.spec in ("mtp", "dflash")  # a drafter of the artifact itself, no --draft-model
    if args.artifact is None or (args.draft_model is None and not own):
        raise ConfigError("--spec draft: give the target ARTIFACT and --draft-model DRAFT")
    if getattr(args, "lm_head_draft", False) and not own:
        raise ConfigError("--lm-head-draft requires --spec mtp or dflash")
    if max(args.batch_sizes) > 8:
        raise ConfigError("--batch-sizes: at most 8 (the engine's --max-concurrency range)")
    device = args.device or "cpu"
    # a .ninfer as it is; a .gguf or Hugging Face directory converted once, as serve does
    source = Artifact(servable_path(args.artifact, check_model=check_tensors))
    vocab = int(source.config.get("vocab_size", 0)) or 1
    if args.prompts:
        pool = render_prompts(source, args.prompts)
    else:
        import torch

        g = torch.Generator().manual_seed(args.seed)
        pool = [torch.randint(0, vocab, (args.input_len,), generator=g).tolist() for _ in range(8)]
    longest = max(len(p) for p in pool)
    page, k, maxb = args.page_size, args.draft_tokens, max(args.batch_sizes)
    ctx = -(-(longest + args.output_len + k + 2) // page) * page
    common: dict[str, Any] = {
        "device": device, "dtype": args.dtype, "max_concurrency": maxb, "max_context": ctx,
        "kv_capacity": maxb * ctx, "page_size": page, "prefill_chunk": max(1024, longest),
        "prefix_reuse": False, "max_pending_requests": len(pool) + maxb,
        "default_max_tokens": args.output_len, "pending_timeout_ms": NO_TIMEOUT_MS,
    }  # fmt: skip
    batches = [
        [pool[i % len(pool)] for i in range(max(b, len(pool) if args.prompts else b))]
        for b in args.batch_sizes
    ]
    context = min(longest + args.output_len // 2, ctx - k - 1)
    # one engine at a time (a large target loaded twice may not fit): plain runs and the step
    # costs first, then the speculative engine
    plain = build_engine(source, EngineOptions.of(**common))
    dtype = plain.config.dtype
    try:
        _run(plain, pool[:1], 4)  # warm-up
        plain_runs = [_run(plain, prompts, args.output_len) for prompts in batches]
        costs = [
            (step_cost(plain.executor, b, 1, context, args.reps),
             step_cost(plain.executor, b, k + 1, context, args.reps))
            for b in args.batch_sizes
        ]  # fmt: skip
    finally:
        plain.close()
    del plain
    drafting: dict[str, Any] = (
        {"spec": "mtp", "lm_head_draft": bool(getattr(args, "lm_head_draft", False))}
        if mtp
        else {"spec": "dflash", "lm_head_draft": bool(getattr(args, "lm_head_draft", False))}
        if own
        else {"spec": "draft", "draft_model": args.draft_model}
    )
    spec = build_engine(source, EngineOptions.of(**common, **drafting, draft_tokens=k))
    assert spec.speculator is not None
    drafter = spec.speculator.drafter  # the draft model's wall time and forwards
    results = []
    try:
        _run(spec, pool[:1], 4)
        for b, prompts, (t_plain, outs_plain), (t1, tv) in zip(
            args.batch_sizes, batches, plain_runs, costs
        ):
            s0 = spec.snapshot()
            d0 = (drafter.seconds, drafter.steps)
            t_spec, outs_spec = _run(spec, prompts, args.output_len)
            time.sleep(0.05)  # the stats publish right after the last finish
            s1 = spec.snapshot()
            rounds = s1.spec_decode_rounds_total - s0.spec_decode_rounds_total
            drafted = s1.spec_decode_draft_tokens_total - s0.spec_decode_draft_tokens_total
            accepted = s1.spec_decode_accepted_tokens_total - s0.spec_decode_accepted_tokens_total
            per_pos = [0] * k
            for o in outs_spec:
                for i, a in enumerate(o.timings.speculative["accepted_per_position"]):
                    per_pos[i] += a
            n_plain = sum(len(o.token_ids) for o in outs_plain)
            n_spec = sum(len(o.token_ids) for o in outs_spec)
            draft_round_s = (drafter.seconds - d0[0]) / max(rounds, 1)
            tau = (accepted + rounds) / rounds if rounds else 0.0
            verify_ratio, draft_ratio = tv / t1, draft_round_s / t1
            results.append({
                "batch": b, "requests": len(prompts), "draft_tokens": k,
                "identical": [o.token_ids for o in outs_plain] == [o.token_ids for o in outs_spec],
                "plain_tok_per_s": n_plain / t_plain, "spec_tok_per_s": n_spec / t_spec,
                "speedup": (n_spec / t_spec) / (n_plain / t_plain),
                "rounds": rounds, "drafted": drafted, "accepted": accepted,
                "acceptance_rate": accepted / drafted if drafted else 0.0,
                "tau": tau, "accept_rate_per_position": [a / rounds if rounds else 0.0 for a in per_pos],
                "decode_step_s": t1, "verify_step_s": tv, "verify_ratio": verify_ratio,
                "draft_round_s": draft_round_s, "draft_ratio": draft_ratio,
                "draft_forwards_per_round": (drafter.steps - d0[1]) / max(rounds, 1),
                "projected_speedup": tau / (verify_ratio + draft_ratio) if tau else 0.0,
            })  # fmt: skip
    finally:
        spec.close()
    return {
        "mode": "engine-spec", "model": source.name,
        "draft_model": (
            ("its MTP head" + (" (--lm-head-draft)" if drafting.get("lm_head_draft") else ""))
            if mtp
            else "its DFlash drafter" + (" (--lm-head-draft)" if drafting.get("lm_head_draft") else "")
            if own
            else Artifact(drafter_path(args)).name
        ),
        "device": device, "dtype": dtype, "spec": drafting["spec"],
        "prompts": args.prompts or f"{len(pool)} random prompts of {args.input_len} tokens",
        "output_len": args.output_len, "results": results,
    }  # fmt: skip


def drafter_path(args: argparse.Namespace) -> str:
    from ninfer.artifact.cache import servable_path
    from ninfer.ir.models import check_tensors

    return str(servable_path(args.draft_model, check_model=check_tensors))


def format_spec_report(report: dict[str, Any]) -> str:
    lines = [
        (
            f"speculative decoding: {report['model']} drafted by {report['draft_model']}"
            f" ({report['device']}, {report['dtype']}; prompts: {report['prompts']};"
            f" up to {report['output_len']} output tokens, greedy)"
        ),
        (
            "batch  k  tau   accept  per position               verify/decode  draft/decode"
            "  projected  plain tok/s  spec tok/s  speed-up  identical"
        ),
    ]
    for r in report["results"]:
        pos = " ".join(f"{a:.2f}" for a in r["accept_rate_per_position"])
        lines.append(
            f"{r['batch']:>5} {r['draft_tokens']:>2} {r['tau']:5.2f} {r['acceptance_rate']:6.2f}"
            f"  {pos:<25} {r['verify_ratio']:13.2f} {r['draft_ratio']:13.2f}"
            f" {r['projected_speedup']:9.2f}x {r['plain_tok_per_s']:11.1f} {r['spec_tok_per_s']:11.1f}"
            f" {r['speedup']:8.2f}x  {r['identical']}"
        )
    return "\n".join(lines)
