"""A served chat with speculation, checked against plain decoding (shared by the serve tests
of each drafter)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai

from ninfer import LLM, SamplingParams
from tests.e2e.test_spec_e2e import _metric


def chat_is_the_plain_reply_with_draft_work(
    server: Any, artifact: Path, content: str, max_tokens: int, k: int
) -> tuple[dict[str, Any], float]:
    """One greedy chat through the official openai client: its tokens are those of plain
    decoding of `artifact`, its timings report draft work (draft_n >= draft_n_accepted > 0),
    and /metrics counts those drafts in rounds of at most `k`. Returns (timings, rounds)."""
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused")
    messages = [{"role": "user", "content": content}]
    r = client.chat.completions.create(
        model=server.model, messages=messages, temperature=0, max_tokens=max_tokens
    )
    plain = LLM(str(artifact), max_concurrency=1, kv_capacity=1024, max_context=1024)
    (want,) = plain.chat(messages, SamplingParams(temperature=0.0, max_tokens=max_tokens))
    assert r.usage.completion_tokens == len(want.token_ids)
    assert r.choices[0].message.content.strip() in want.text
    timings = r.model_extra["timings"]
    assert timings["draft_n"] >= timings["draft_n_accepted"] > 0
    rounds = _metric(server.base_url, "ninfer_spec_decode_rounds_total")
    assert _metric(server.base_url, "ninfer_spec_decode_draft_tokens_total") == timings["draft_n"]
    assert 0 < rounds and timings["draft_n"] <= k * rounds
    return timings, rounds
