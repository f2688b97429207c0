"""The transformers side of `ninfer bench --peer transformers`: the same prompts, greedy, the
same number of output tokens, through the model's own forward with its KV cache (eager, as
`generate` runs it), timed per token after a device sync."""

from __future__ import annotations

import time
from typing import Any

import torch

from ninfer.bench.loadgen import RequestTiming


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def peer_load(model: Any, prompts: list[list[int]], output_len: int) -> list[RequestTiming]:
    """One batch of equal-length prompts: a prefill forward, then output_len - 1 decode
    forwards; every request sees the same token times (a static batch)."""
    device = next(model.parameters()).device
    if len({len(p) for p in prompts}) != 1:
        raise ValueError("the transformers peer runs equal-length prompts")
    ids = torch.tensor(prompts, device=device)
    _sync(device)
    t0 = time.perf_counter()
    out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
    nxt = out.logits[:, -1].argmax(-1)  # [B]
    past = out.past_key_values
    times = []
    _sync(device)
    times.append(time.perf_counter())
    for _ in range(output_len - 1):
        out = model(input_ids=nxt[:, None], past_key_values=past, use_cache=True)
        nxt = out.logits[:, -1].argmax(-1)
        past = out.past_key_values
        _sync(device)
        times.append(time.perf_counter())
    return [RequestTiming(t0, list(times)) for _ in prompts]
