"""Quality of each storage choice on a real model: perplexity and KL divergence against the same
model's dequantised float32 logits.

    python bench/quality.py --model qwen2.5-coder-0.5b                 # fetches it if needed
    python bench/quality.py --gguf FILE.gguf --name my-model --tokens 1024 --window 256

The reference is the GGUF converted without --weights: its own blocks (Q4_K, Q6_K, ...)
dequantised exactly to float32 at load, float32 compute, float32 KV cache. Each row changes one
storage choice against it:

    --weights bf16 / fp8 / nvfp4    re-quantised from the dequantised GGUF weights by
                                    `ninfer convert --weights` (fp8 and nvfp4 quantise the
                                    attention and MLP projections; the other matrices go bf16)
    --weights nvfp4 --quantize-lm-head   the head in nvfp4 too
    --kv-dtype int8 / fp8 / nvfp4 / k8v4 the reference weights with a quantised KV cache

The text (`--text`, default bench/data/quality_text.txt: code and prose written for this
benchmark) is encoded with the model's tokenizer, cut to `--tokens`, and split into
non-overlapping windows of `--window` tokens; each window is one prefill from position 0 (the KV
cache is written and read back through its storage format inside that prefill, so KV rounding is
measured). Over every next-token prediction of every window:

    ppl       exp(mean negative log-likelihood of the actual next token)
    KL        sum_v p_ref(v) (log p_ref(v) - log p(v)), per position, in nats: mean and p99
    top-1     fraction of positions whose argmax equals the reference's

Runs on CPU (float32) or CUDA (`--device cuda`; float32 too, so the reference is the same).
Not a timed test; results go to bench/results/quality_<name>.{md,json} with the command line.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import platform
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ninfer.artifact.convert_gguf import convert_gguf
from ninfer.artifact.model_fetch import fetch, known_model

TEXT = REPO / "bench" / "data" / "quality_text.txt"
KV_DTYPES = ("int8", "fp8", "nvfp4", "k8v4")


@dataclass(frozen=True)
class Choice:
    """One row: which artifact (weights, head) and which KV dtype."""

    label: str
    weights: str | None = None
    quantize_lm_head: bool = False
    kv_dtype: str | None = None

    @property
    def artifact_key(self) -> str:
        return f"{self.weights or 'gguf'}{'-head' if self.quantize_lm_head else ''}"


CHOICES = (
    Choice("reference: GGUF blocks dequantised, f32 KV"),
    Choice("--weights bf16", weights="bf16"),
    Choice("--weights fp8", weights="fp8"),
    Choice("--weights nvfp4", weights="nvfp4"),
    Choice("--weights nvfp4 --quantize-lm-head", weights="nvfp4", quantize_lm_head=True),
    *(Choice(f"--kv-dtype {kv}", kv_dtype=kv) for kv in KV_DTYPES),
)


@dataclass
class Row:
    label: str
    ppl: float
    kl_mean: float
    kl_p99: float
    top1: float
    seconds: float


def _artifact(gguf: Path, work: Path, c: Choice) -> Path:
    out = work / f"{c.artifact_key}.ninfer"
    if not out.exists():
        convert_gguf(gguf, out, weights=c.weights, quantize_lm_head=c.quantize_lm_head)
    return out


def _windows(ids: list[int], window: int) -> list[list[int]]:
    return [ids[i : i + window] for i in range(0, len(ids) - window + 1, window)]


def _log_probs(llm, window: list[int]) -> torch.Tensor:
    """log-softmax of the logits that predict tokens 1..W-1 of the window: [W-1, vocab] f32."""
    return torch.log_softmax(llm.logits(window)[:-1].float(), dim=-1)


def run_choice(
    c: Choice, artifact: Path, windows: list[list[int]], ref: np.ndarray | None, args
) -> tuple[Row, np.ndarray | None]:
    """Evaluate one choice; with `ref` None this is the reference and its log-probs are
    returned (a memmap [windows, W-1, vocab])."""
    from ninfer import LLM

    t0 = time.monotonic()
    options = {"kv_dtype": c.kv_dtype} if c.kv_dtype else {}
    llm = LLM(
        str(artifact),
        device=args.device,
        dtype="float32",
        kv_capacity=args.window,
        max_context=args.window,
        **options,
    )
    store = None
    nll, kls, agree = [], [], 0
    try:
        for w, window in enumerate(windows):
            lp = _log_probs(llm, window)  # [W-1, V]
            target = torch.tensor(window[1:])
            nll.append(-lp.gather(1, target[:, None])[:, 0].numpy())
            if ref is None:
                if store is None:
                    path = Path(args.scratch) / "reference_logprobs.npy"
                    shape = (len(windows), *lp.shape)
                    store = np.lib.format.open_memmap(path, "w+", np.float32, shape)
                store[w] = lp.numpy()
                kls.append(np.zeros(lp.shape[0]))
                agree += lp.shape[0]
            else:
                r = torch.from_numpy(np.asarray(ref[w]))
                kls.append((r.exp() * (r - lp)).sum(-1).clamp_min(0).numpy())
                agree += int((r.argmax(-1) == lp.argmax(-1)).sum())
            print(f"  {c.label}: window {w + 1}/{len(windows)}", file=sys.stderr, flush=True)
    finally:
        del llm
        gc.collect()
    nll_all, kl_all = np.concatenate(nll), np.concatenate(kls)
    row = Row(
        label=c.label,
        ppl=float(np.exp(nll_all.mean())),
        kl_mean=float(kl_all.mean()),
        kl_p99=float(np.percentile(kl_all, 99)),
        top1=agree / len(kl_all),
        seconds=round(time.monotonic() - t0, 1),
    )
    return row, store


def write_results(stem: Path, meta: dict, rows: list[Row]) -> None:
    """`stem`.json (meta and rows) and `stem`.md (the table)."""
    # not with_suffix: a name such as qwen2.5-coder-0.5b has dots of its own
    stem.parent.joinpath(stem.name + ".json").write_text(
        json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=2) + "\n"
    )
    stem.parent.joinpath(stem.name + ".md").write_text(_markdown(meta, rows))


def _markdown(meta: dict, rows: list[Row]) -> str:
    lines = [
        f"# Quality of storage choices: {meta['name']}",
        "",
        f"`{meta['command']}`",
        "",
        (
            f"GGUF `{meta['gguf']}` (SHA-256 `{meta['sha256'][:16]}…`), {meta['tokens']} tokens "
            f"of `{meta['text']}` in {meta['windows']} windows of {meta['window']}, "
            f"{meta['positions']} predictions; device {meta['device']}, float32 compute; "
            f"{meta['date']}, {meta['host']}."
        ),
        "",
        "| storage choice | ppl | Δppl | mean KL (nats) | p99 KL | top-1 = ref |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    base = rows[0].ppl
    for r in rows:
        lines.append(
            f"| {r.label} | {r.ppl:.4f} | {r.ppl - base:+.4f} | {r.kl_mean:.5f} | "
            f"{r.kl_p99:.4f} | {100 * r.top1:.2f}% |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="a name from `ninfer models list` (fetched if needed)")
    src.add_argument("--gguf", type=Path, help="a GGUF file")
    p.add_argument("--name", help="results name (default: the model name or the file stem)")
    p.add_argument("--text", type=Path, default=TEXT)
    p.add_argument("--tokens", type=int, default=2048, help="tokens of the text used")
    p.add_argument("--window", type=int, default=512, help="tokens per prefill window")
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--only",
        help="rows besides the reference, comma-separated: w-bf16, w-fp8, w-nvfp4, "
        "w-nvfp4-head, kv-int8, kv-fp8, kv-nvfp4, kv-k8v4 (default: all)",
    )
    p.add_argument("--work", type=Path, help="folder for converted artifacts (kept for reuse)")
    p.add_argument("--out-dir", type=Path, default=REPO / "bench" / "results")
    args = p.parse_args(argv)

    gguf = fetch(known_model(args.model)) if args.model else args.gguf
    name = args.name or args.model or gguf.stem
    work = args.work or Path(tempfile.gettempdir()) / f"ninfer-quality-{name}"
    work.mkdir(parents=True, exist_ok=True)
    args.scratch = str(work)

    ref_artifact = _artifact(gguf, work, CHOICES[0])
    from tokenizers import Tokenizer

    from ninfer.artifact import Artifact

    a = Artifact(ref_artifact)
    ids = Tokenizer.from_str(a.tokenizer_json).encode(args.text.read_text("utf-8")).ids
    a.close()
    if len(ids) < args.tokens:
        print(f"note: the text has {len(ids)} tokens, fewer than --tokens", file=sys.stderr)
    windows = _windows(ids[: args.tokens], args.window)
    if not windows:
        p.error(f"--window {args.window} is longer than the {len(ids)} tokens of the text")

    keys = {"w-bf16", "w-fp8", "w-nvfp4", "w-nvfp4-head", *(f"kv-{k}" for k in KV_DTYPES)}
    wanted = set(args.only.split(",")) if args.only else keys
    if wanted - keys:
        p.error(f"--only: unknown {sorted(wanted - keys)} (choose from {sorted(keys)})")

    def key(c: Choice) -> str:
        return f"kv-{c.kv_dtype}" if c.kv_dtype else f"w-{c.artifact_key}"

    h = hashlib.sha256()
    with gguf.open("rb") as f:
        while block := f.read(1 << 23):
            h.update(block)
    meta = {
        "name": name,
        "command": "python bench/quality.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "gguf": gguf.name,
        "sha256": h.hexdigest(),
        "text": str(args.text.relative_to(REPO) if args.text.is_relative_to(REPO) else args.text),
        "tokens": sum(len(w) for w in windows),
        "window": args.window,
        "windows": len(windows),
        "positions": sum(len(w) - 1 for w in windows),
        "device": args.device,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "host": f"{platform.machine()}, {torch.get_num_threads()} torch threads",
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stem = args.out_dir / f"quality_{name}"
    rows: list[Row] = []
    ref = None
    for c in CHOICES:
        if c is not CHOICES[0] and key(c) not in wanted:  # the reference always runs
            continue
        artifact = _artifact(gguf, work, c)
        row, store = run_choice(c, artifact, windows, ref, args)
        if ref is None:
            ref = store
        rows.append(row)
        print(json.dumps(asdict(row)), file=sys.stderr, flush=True)
        write_results(stem, meta, rows)  # after every row: a stopped run keeps what it measured
    print(_markdown(meta, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
