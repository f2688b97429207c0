"""Tokenizer fixtures for the API text-layer tests.

- `qwen_tokenizer`: a tiny byte-level BPE (GPT-2/Qwen style) trained here, with Qwen's control
  tokens: <|endoftext|>, <|im_start|>, <|im_end|> special; <think>, </think>, <tool_call>,
  </tool_call>, <tool_response>, </tool_response> added, not special, not normalized (as in
  Qwen3's tokenizer.json).
- `sp_tokenizer`: a tiny SentencePiece-style BPE (Llama/SmolLM-like Metaspace pieces with byte
  fallback, decoder Replace + ByteFallback + Fuse + Strip), so CJK and emoji go through
  `<0xXX>` byte tokens.
- `qwen_template`: ninfer/api/service/templates/qwen_xml.jinja bound to `qwen_tokenizer`'s control
  tokens.
"""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer, decoders, models, normalizers
from tokenizers.trainers import BpeTrainer

from artifacts.tokenizer import MARKUP_TOKENS, SPECIAL_TOKENS, train_byte_level

# The metric families docs/serving.md lists, by Prometheus type, as
# prometheus_client's parser names them (counters without _total). Shared with the e2e suite.
METRIC_FAMILIES: dict[str, set[str]] = {
    "gauge": {
        "ninfer_model_info", "ninfer_max_concurrency", "ninfer_max_context_tokens", "ninfer_engine_ready",
        "ninfer_requests_running", "ninfer_requests_waiting", "ninfer_requests_paused",
        "ninfer_requests_prefilling", "ninfer_requests_decode_ready", "ninfer_requests_replaying",
        "ninfer_requests_materializing", "ninfer_device_kv_used_pages", "ninfer_device_kv_capacity_pages",
        "ninfer_device_state_used_slots", "ninfer_device_state_capacity_slots",
        "ninfer_host_context_used_bytes", "ninfer_host_context_reserved_bytes",
        "ninfer_host_context_capacity_bytes", "ninfer_host_context_peak_bytes",
    },
    "counter": {
        "ninfer_prompt_tokens", "ninfer_prompt_tokens_cached", "ninfer_prefill_tokens",
        "ninfer_replayed_tokens", "ninfer_generation_tokens", "ninfer_decode_tokens",
        "ninfer_spec_decode_rounds", "ninfer_spec_decode_draft_tokens",
        "ninfer_spec_decode_accepted_tokens", "ninfer_spec_decode_fallback_steps",
        "ninfer_preemptions", "ninfer_snapshot_restores", "ninfer_replay_restores",
        "ninfer_context_transfer_bytes", "ninfer_host_work_seconds", "ninfer_device_wait_seconds",
        "ninfer_requests", "ninfer_response_failures",
    },
    "histogram": {
        "ninfer_time_to_first_token_seconds", "ninfer_request_duration_seconds", "ninfer_request_queue_seconds",
    },
}  # fmt: skip

CORPUS = [
    "The quick brown fox jumps over the lazy dog. Hello, how are you today?",
    "You are a helpful assistant. What is the weather in Paris? It is sunny and warm.",
    "Let me think about this question. The user wants the weather, so I call a tool.",
    "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n",
    '{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}',
    'Numbers 0 1 2 3 4 5 6 7 8 9 10 42 3.14 true false null [1, 2] {"a": 1}',
    "Café naïve résumé Zürich. 你好，世界。今天天气很好。こんにちは。",
    "Emoji 🙂 🚀 👍 🎉 ❤️ and more text with system user assistant im_start im_end.",
]


def _corpus() -> list[str]:
    return [t for t in CORPUS for _ in range(4)]


def build_qwen_tokenizer() -> Tokenizer:
    return train_byte_level(_corpus(), 420, SPECIAL_TOKENS, MARKUP_TOKENS)


def build_sp_tokenizer() -> Tokenizer:
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    trainer = BpeTrainer(
        vocab_size=600,
        min_frequency=2,
        show_progress=False,
        special_tokens=["<unk>", "<s>", "</s>", *byte_tokens],
        limit_alphabet=60,  # keep CJK and emoji out of the base alphabet: they use byte tokens
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    # As in Llama's tokenizer.json, the <0xXX> pieces are ordinary vocabulary, not added tokens.
    spec = json.loads(tok.to_str())
    spec["added_tokens"] = [a for a in spec["added_tokens"] if a["content"] not in byte_tokens]
    return Tokenizer.from_str(json.dumps(spec))


@pytest.fixture(scope="session")
def qwen_tokenizer() -> Tokenizer:
    return build_qwen_tokenizer()


@pytest.fixture(scope="session")
def sp_tokenizer() -> Tokenizer:
    return build_sp_tokenizer()


@pytest.fixture(scope="session")
def qwen_template(qwen_tokenizer: Tokenizer):
    from ninfer.api.service.template import TEMPLATES_DIR, chat_template_for

    source = (TEMPLATES_DIR / "qwen_xml.jinja").read_text(encoding="utf-8")
    return chat_template_for(source, qwen_tokenizer, special_tokens={"eos_token": "<|im_end|>"})


@pytest.fixture
def prompt_service(qwen_tokenizer: Tokenizer, qwen_template):
    """A ModelService that only prepares (renders and encodes) requests: no engine."""
    from ninfer.api.service.model_service import ModelService

    return ModelService(
        engine=None,
        tokenizer=qwen_tokenizer,
        template=qwen_template,
        eos_ids=(),
        max_context=8192,
    )
