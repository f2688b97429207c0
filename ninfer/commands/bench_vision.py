"""`ninfer bench engine --images N [--image-size WxH]`: image-prefill throughput.

Each request of a batch is `--input-len` random text tokens followed by N images of random
pixels (W x H before the preprocessor's smart resize; each its own digest, so nothing comes from
the executor's embedding cache), laid out as Qwen3.5's processor does (<|vision_start|>, the
placeholders, <|vision_end|>), and generates one token: the load is the prefill. The images are
prepared (ninfer.media: resize, normalise, patch rows) before the clock starts; what is timed is
the engine: the vision stage once per image, then the text prefill over the merged rows.

Per batch size b the report gives the wall time from submitting the b requests to their first
tokens (`prefill_s`), the vision stage's own time within it (`vision_encode_s`: device time
between CUDA events on a GPU) and the rest (`text_prefill_s`: text prefill, sampling and host
work), images/s and vision tokens/s over the whole prefill, and over the vision stage alone.
A warm-up round of the same shape (other images) runs first.
"""

from __future__ import annotations

import argparse
import hashlib
import time
from typing import Any

from ninfer.errors import ConfigError


def image_size(text: str) -> tuple[int, int]:
    """`WxH` -> (width, height)."""
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected WIDTHxHEIGHT (e.g. 448x448), got {text!r}"
        ) from None
    if not (1 <= w <= 16384 and 1 <= h <= 16384):
        raise argparse.ArgumentTypeError(f"image size {text!r}: each side 1..16384 pixels")
    return w, h


def add_arguments(e: argparse.ArgumentParser) -> None:
    """The engine parser's --images / --image-size, then the options every bench mode has."""
    from ninfer.commands.bench import _common

    e.add_argument(
        "--images",
        type=int,
        default=0,
        help="image-prefill load: N images per request through the vision stage (needs a "
        "vision model: an ARTIFACT with the vision component or --synthetic *-vl)",
    )
    e.add_argument(
        "--image-size",
        type=image_size,
        default=(448, 448),
        metavar="WxH",
        help="pixels of each --images image before the smart resize (default 448x448)",
    )
    _common(e)


def _images(n: int, size: tuple[int, int], config: Any, seed: int) -> list[Any]:
    """n prepared random images (ninfer.media.PreparedMedia) and their digests."""
    import numpy as np
    from PIL import Image

    from ninfer.media.image import prepare_rgb

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        rgb = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
        out.append((prepare_rgb(Image.fromarray(rgb), config), hashlib.sha256(rgb).digest()))
    return out


def _request(text: list[int], images: list[Any], ids: dict[str, int]) -> Any:
    from ninfer.runtime.media_span import MediaSpan
    from ninfer.runtime.request import Request, SamplingParams

    prompt = list(text)
    spans = []
    for m, digest in images:
        prompt.append(ids["start"])
        spans.append(MediaSpan(len(prompt), m.tokens, m.grid_thw, digest, "image", m))
        prompt += [ids["image"]] * m.tokens + [ids["end"]]
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    return Request(tuple(prompt), params, media=tuple(spans))


def run(args: argparse.Namespace) -> int:
    """`ninfer bench engine --images N`: run the load, print the report, write --json / --md."""
    from ninfer.commands.bench_report import command_line, write_report

    if getattr(args, "spec", None):
        raise ConfigError("--images: not with --spec (one load per run)")
    report = run_images(args)
    report["command"] = command_line()
    print(format_images(report))
    write_report(report, args, format_images_markdown)
    return 0


def run_images(args: argparse.Namespace) -> dict[str, Any]:
    """The image-prefill report (see the module docstring)."""
    import torch

    from ninfer.api.service.media_path import preprocess_config
    from ninfer.commands.bench import _default_device, _prompts
    from ninfer.passes.options import parse_kv_capacity
    from ninfer.runtime.build import build_engine
    from ninfer.runtime.config import EngineOptions

    if (args.artifact is None) == (args.synthetic is None):
        raise ConfigError("give an ARTIFACT or --synthetic NAME (not both)")
    if args.images < 1 or args.images > 256:
        raise ConfigError(f"--images {args.images}: 1..256 images per request")
    if args.peer:
        raise ConfigError("--peer: not with --images (the image-prefill load runs ninfer only)")
    if max(args.batch_sizes) > 8:
        raise ConfigError("--batch-sizes: at most 8 (the engine's --max-concurrency range)")
    device = _default_device(args.device)
    t0 = time.perf_counter()
    if args.synthetic:
        from ninfer.bench.synthetic import build_synthetic

        source, _ = build_synthetic(
            args.synthetic, args.weights, device, args.seed, args.quantize_lm_head
        )
        processor = None
    else:
        from ninfer.artifact import Artifact

        source = Artifact(args.artifact)
        if "vision" not in source.components:
            raise ConfigError(
                f"--images: {args.artifact} has no vision component (convert the model's "
                "Hugging Face directory with its visual.* weights)"
            )
        processor = source.preprocessor
    config = dict(source.config)
    if not isinstance(config.get("vision_config"), dict):
        raise ConfigError(f"--images: --synthetic {args.synthetic} has no vision tower")
    dtype = args.dtype or ("float32" if device == "cpu" else "bfloat16")
    pre = preprocess_config(config, dtype, processor)
    one = _images(1, args.image_size, pre, args.seed)[0][0]
    ids = {
        "start": int(config["vision_start_token_id"]),
        "end": int(config["vision_end_token_id"]),
        "image": int(config["image_token_id"]),
    }
    prompt_len = args.input_len + args.images * (one.tokens + 2)
    page, maxb = args.page_size, max(args.batch_sizes)
    ctx = -(-(prompt_len + 2) // page) * page
    options = EngineOptions.of(
        device=device, dtype=args.dtype, kv_dtype=args.kv_dtype, max_concurrency=maxb,
        max_context=ctx, kv_capacity=parse_kv_capacity(args.kv_capacity) or maxb * ctx,
        page_size=page, prefill_chunk=args.prefill_chunk or max(1024, prompt_len),
        cuda_graphs=not args.no_cuda_graph, prefix_reuse=False, max_pending_requests=maxb,
        default_max_tokens=1, vision=True,
    )  # fmt: skip
    engine = build_engine(source, options)
    plan, ex = engine.plan, engine.executor
    del source
    load_s = time.perf_counter() - t0
    media = ex.media
    media.timing = True
    vocab = int(plan.model["vocab"])
    seed = args.seed * 7919 + 1  # images of every round distinct
    results = []

    def round_(b: int, text_seed: int) -> dict[str, Any]:
        nonlocal seed
        texts = _prompts(b, args.input_len, min(vocab, ids["start"]), text_seed)
        reqs = []
        for t in texts:
            seed += 1
            reqs.append(_request(t, _images(args.images, args.image_size, pre, seed), ids))
        items, tokens, enc = media.encoded_items, media.encoded_tokens, media.encode_seconds()
        start = time.perf_counter()
        outs = [h.result(600) for h in [engine.submit(r) for r in reqs]]
        wall = time.perf_counter() - start
        failed = [o.error for o in outs if o.error is not None]
        if failed:
            raise RuntimeError(f"image-prefill request failed: {failed[0]}")
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        n, vt = media.encoded_items - items, media.encoded_tokens - tokens
        encode_s = media.encode_seconds() - enc
        return {
            "batch": b,
            "images": n,
            "vision_tokens": vt,
            "prompt_tokens": sum(len(r.prompt_token_ids) for r in reqs),
            "prefill_s": wall,
            "vision_encode_s": encode_s,
            "text_prefill_s": wall - encode_s,
            "images_per_s": n / wall,
            "vision_tok_per_s": vt / wall,
            "prompt_tok_per_s": sum(len(r.prompt_token_ids) for r in reqs) / wall,
            "encode_images_per_s": n / encode_s if encode_s > 0 else None,
            "encode_vision_tok_per_s": vt / encode_s if encode_s > 0 else None,
        }

    try:
        t1 = time.perf_counter()
        for b in args.batch_sizes:
            round_(b, args.seed + 1)  # warm-up: every kernel variant of the shapes
        warm_s = time.perf_counter() - t1
        for b in args.batch_sizes:
            results.append(round_(b, args.seed))
    finally:
        engine.close()
    return {
        "mode": "engine-images",
        "model": plan.name,
        "architecture": plan.architecture,
        "weights": args.weights if args.synthetic else "artifact",
        "device": str(ex.device),
        "dtype": plan.dtype,
        "input_len": args.input_len,
        "images_per_request": args.images,
        "image_size": list(args.image_size),
        "image_grid": list(one.grid_thw),
        "tokens_per_image": one.tokens,
        "vision_kernels": sorted({plan.calls[i].kernel for i in plan.vision_calls}),
        "load_s": load_s,
        "warmup_s": warm_s,
        "results": results,
    }


COLUMNS = ("batch", "images", "vision tok", "prefill s", "vision encode s", "text prefill s",
           "images/s", "vision tok/s", "prompt tok/s", "encode images/s", "encode vision tok/s")  # fmt: skip


def _cells(r: dict[str, Any]) -> list[str]:
    def f(v: Any, fmt: str) -> str:
        return "-" if v is None else fmt.format(v)

    return [
        str(r["batch"]), str(r["images"]), str(r["vision_tokens"]), f(r["prefill_s"], "{:.4f}"),
        f(r["vision_encode_s"], "{:.4f}"), f(r["text_prefill_s"], "{:.4f}"),
        f(r["images_per_s"], "{:.1f}"), f(r["vision_tok_per_s"], "{:.0f}"),
        f(r["prompt_tok_per_s"], "{:.0f}"), f(r["encode_images_per_s"], "{:.1f}"),
        f(r["encode_vision_tok_per_s"], "{:.0f}"),
    ]  # fmt: skip


def _header(report: dict[str, Any]) -> list[str]:
    w, h = report["image_size"]
    t, gh, gw = report["image_grid"]
    first = (
        f"mode=engine-images model={report['model']} weights={report['weights']} "
        f"dtype={report['dtype']} device={report['device']} input_len={report['input_len']}"
    )
    load = (
        f"{report['images_per_request']} image(s) per request, {w}x{h} pixels -> patch grid "
        f"{t}x{gh}x{gw}, {report['tokens_per_image']} vision tokens each; one output token"
    )
    return [first, load, "vision kernels: " + " ".join(report["vision_kernels"])]


def format_images(report: dict[str, Any]) -> str:
    rows = [list(COLUMNS)] + [_cells(r) for r in report["results"]]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    out = _header(report) + ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows]
    return "\n".join(out)


def format_images_markdown(report: dict[str, Any]) -> str:
    out = [f"`{report.get('command', 'ninfer bench')}`", ""] + [f"{x}  " for x in _header(report)]
    out += ["", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    out += ["| " + " | ".join(_cells(r)) + " |" for r in report["results"]]
    return "\n".join(out) + "\n"
