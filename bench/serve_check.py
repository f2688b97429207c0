"""Drive `ninfer serve` on random-weight real-shape artifacts with the Chat Completions requests
of the e2e tests, and record what happened (for the GPU acceptance of issue [8/9]).

For each (model, weights, kv dtype) it writes the artifact on this machine
(artifacts/random_artifact.py), starts `ninfer serve ARTIFACT --device cuda --kv-dtype K`, and
sends: an aggregate and a streamed request at temperature 0 (streamed text must equal the
aggregate; one finish_reason; usage only when asked), a request with function tools, a stop
string, two concurrent streams (must interleave), then reads /metrics. Outputs of random
weights are meaningless text; the checks are about the protocol, batching and CUDA Graph replay
(the server log must report captured graphs unless --no-cuda-graph).

    python bench/serve_check.py --models qwen3-8b,qwen3.5-9b-hybrid --weights bf16,fp8,nvfp4 \
        --kv-dtypes bf16,fp8 --workdir /tmp/serve-check --out bench/results/serve_check.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # artifacts/ is a folder of scripts, not an installed package


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(
    artifact: Path, kv: str, log: Path, extra: list[str], device: str = "cuda"
) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "ninfer.cli", "serve", str(artifact), "--port", str(port), "--device", device,
           "--kv-dtype", kv, "--max-concurrency", "4", "--max-context", "4096", *extra]  # fmt: skip
    with open(log, "wb") as out:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited {proc.returncode}: {log.read_text()[-3000:]}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError("server not ready in 600 s")


def chat(url: str, model: str, **kw) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": "Hi! Tell me about the weather."}],
            "max_tokens": 32, "temperature": 0, **kw}  # fmt: skip
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=300)
    r.raise_for_status()
    return r.json()


def stream(url: str, model: str, out: list, **kw) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": "Hi! Tell me about the weather."}],
            "max_tokens": 32, "temperature": 0, "stream": True, **kw}  # fmt: skip
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=300) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                out.append((time.monotonic(), json.loads(line[6:])))


def check(url: str) -> dict:
    model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
    res: dict = {}
    full = chat(url, model)
    text = full["choices"][0]["message"]["content"] or ""
    chunks: list = []
    stream(url, model, chunks, stream_options={"include_usage": True})
    streamed = "".join(
        (c["choices"][0]["delta"].get("content") or "") for _, c in chunks if c["choices"]
    )
    finishes = [
        c["choices"][0]["finish_reason"]
        for _, c in chunks
        if c["choices"] and c["choices"][0]["finish_reason"]
    ]
    res["stream_equals_aggregate"] = streamed == text
    res["one_finish_reason"] = len(finishes) == 1
    res["usage_chunk"] = sum(1 for _, c in chunks if c.get("usage")) == 1
    res["decode_tok_s"] = full["timings"]["predicted_per_second"]
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    res["tools_request_ok"] = chat(url, model, tools=tools)["choices"][0]["finish_reason"] in (
        "stop",
        "length",
        "tool_calls",
    )
    res["stop_request_ok"] = chat(url, model, stop=["e"])["choices"][0]["finish_reason"] in (
        "stop",
        "length",
    )
    a: list = []
    b: list = []
    ta = threading.Thread(
        target=stream, args=(url, model, a), kwargs={"max_tokens": 64, "ignore_eos": True}
    )
    tb = threading.Thread(
        target=stream, args=(url, model, b), kwargs={"max_tokens": 64, "ignore_eos": True}
    )
    running: list[float] = []
    ta.start(), tb.start()
    while ta.is_alive() or tb.is_alive():  # the server's own count of requests decoding
        text = httpx.get(url + "/metrics").text
        running += [
            float(x.split()[-1])
            for x in text.splitlines()
            if x.startswith("ninfer_requests_running")
        ]
        time.sleep(0.02)
    ta.join(), tb.join()
    res["max_running"] = max(running, default=0)
    # both in flight at once (content deltas themselves may be held to the end when random
    # tokens open a tool-call region, so chunk order alone does not show it)
    res["concurrent"] = bool(a and b and res["max_running"] >= 2)
    res["metrics_ok"] = "ninfer_generation_tokens_total" in httpx.get(url + "/metrics").text
    return res


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="qwen3-8b,qwen3.5-9b-hybrid")
    p.add_argument("--weights", default="bf16,fp8,nvfp4")
    p.add_argument("--kv-dtypes", default="bf16,fp8")
    p.add_argument("--workdir", default="/tmp/serve-check")
    p.add_argument("--out", default=str(ROOT / "bench/results/serve_check.json"))
    p.add_argument("--device", default="cuda")
    args = p.parse_args()
    from artifacts.random_artifact import write_random_artifact

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    results = []
    for name in args.models.split(","):
        for w in args.weights.split(","):
            path = work / f"{name}-{w}.ninfer"
            t0 = time.monotonic()
            write_random_artifact(name, path, weights=w, device=args.device)
            made = time.monotonic() - t0
            for kv in args.kv_dtypes.split(","):
                row = {"model": name, "weights": w, "kv_dtype": kv, "artifact_s": made}
                log = work / f"serve-{name}-{w}-{kv}.log"
                try:
                    proc, url = start(path, kv, log, [], args.device)
                    try:
                        row.update(check(url))
                    finally:
                        proc.terminate()
                        proc.wait(60)
                    row["graphs_captured"] = "CUDA Graph decode buckets" in log.read_text()
                except Exception as e:  # noqa: BLE001 - recorded in the row, the sweep goes on
                    row["error"] = f"{type(e).__name__}: {e}"[:2000]
                print(json.dumps(row), flush=True)
                results.append(row)
                Path(args.out).write_text(
                    json.dumps(results, indent=2)
                )  # kept if a later row hangs
            path.unlink()
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
