"""A tiny byte-level BPE tokenizer with the Qwen special tokens, for test fixtures.

`build_tokenizer()` trains it deterministically (same corpus, same merges, same ids) on the
small built-in corpus below: English, accented Latin, CJK, emoji and the chat / tool-call
markup our Qwen-style template renders, so common markup encodes in a few tokens. Every byte
is in the base alphabet, so any text round-trips.

Layout of the vocabulary (`VOCAB_SIZE` = 512 ids):

    0 .. 255                 the 256 byte-level symbols
    256 .. 502               learned merges
    503 .. 511               added tokens, in `ADDED_TOKENS` order (<|endoftext|> = 503,
                             <|im_start|> = 504, <|im_end|> = 505, <think> = 506, ...)

As in Qwen's tokenizers, <|endoftext|>, <|im_start|> and <|im_end|> are *special* (dropped by
`decode(skip_special_tokens=True)`); the think / tool markers are added but not special, so they
survive decoding and parsers can see them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from tokenizers.trainers import BpeTrainer

VOCAB_SIZE = 512
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
MARKUP_TOKENS = (
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)
ADDED_TOKENS = SPECIAL_TOKENS + MARKUP_TOKENS
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"

# Split before byte-level mapping: contractions, letter runs with one leading non-letter,
# single digits, punctuation runs (with trailing newlines), newline runs, other whitespace.
_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_CORPUS = [
    # plain English
    "The quick brown fox jumps over the lazy dog. The dog sleeps in the sun all day.",
    "Hello! How are you today? I am fine, thank you. What can I do for you?",
    "Sure, here is the answer. Let me think about the question first, then I will reply.",
    "It is going to be sunny tomorrow, with a light wind in the afternoon and rain at night.",
    "The weather in the city is cold and cloudy; the temperature is low, so take a coat.",
    "Please set an alarm for seven in the morning. The alarm is enabled and will ring.",
    "I will search for the best results and add the numbers: the sum of two and three is five.",
    "You are a helpful assistant. Answer the user briefly and call a tool when you need one.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 12 21 42 100 2024 3.14 -7 1e3 07:30 12:45 true false null",
    # accents, CJK, emoji
    "Café, naïve, résumé, Zürich, São Paulo, España, Kraków, Ångström, façade, déjà vu.",
    "Bonjour le monde ! Où est la gare ? Grüße aus München. ¿Qué tal? Ça va très bien.",
    "你好，世界。今天天气很好。我们去北京吧。",
    "こんにちは世界。東京の天気は晴れです。",
    "안녕하세요 세계. 서울의 날씨는 맑음.",
    "Emoji: 🙂 😀 🚀 🌧️ ☀️ ❄️ 👍 🎉 ❤️ 🐍",
    # chat and tool markup (the special tokens themselves are added tokens, not merges)
    "system\nYou are a helpful assistant.\n\nuser\nWhat is the weather in Paris?\nassistant\n",
    "\n\nOkay, the user asks about the weather. I should call get_weather.\n\n",
    "\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n",
    "\n<function=add>\n<parameter=a>\n2.5\n</parameter>\n<parameter=b>\n4\n</parameter>\n</function>\n",
    "\n<function=set_alarm>\n<parameter=time>\n07:30\n</parameter>\n<parameter=enabled>\ntrue\n</parameter>\n</function>\n",
    (
        "\n<function=search>\n<parameter=query>\ncheap flights\n</parameter>\n<parameter=filters>\n"
        '{"max_price": 300, "tags": ["direct", "morning"]}\n</parameter>\n</function>\n'
    ),
    "# Tools\n\nThese functions are available to you:\n\n<tools>\n",
    (
        '{"type": "function", "function": {"name": "get_weather", "description": "Get the weather '
        'forecast for a city.", "parameters": {"type": "object", "properties": {"city": {"type": '
        '"string"}, "days": {"type": "integer"}}, "required": ["city"]}}}\n</tools>\n'
    ),
    (
        "\n</tools>\n\nTo call a function, end your reply with one or more blocks in exactly this form:"
        "\n\n\n<function=function_name>\n<parameter=parameter_name>\nvalue\n</parameter>\n</function>\n"
    ),
    (
        "Write each value as plain text (strings) or JSON (numbers, booleans, arrays, objects); values "
        "may span several lines. Put any explanation before the first call, never after the last."
    ),
    'user\n\n{"temperature": 18, "condition": "sunny"}\n\nassistant\n',
]


def corpus() -> list[str]:
    """The training texts (a copy; repeated so frequent markup wins merges over rare words)."""
    return [t for t in _CORPUS for _ in range(3)]


def train_byte_level(
    texts: list[str],
    vocab_size: int,
    special: tuple[str, ...] | list[str],
    markup: tuple[str, ...] | list[str],
    pre_tokenizer: Any = None,
) -> Tokenizer:
    """A Qwen-style byte-level BPE tokenizer trained on `texts`: `vocab_size` learned ids
    (bytes included), then the `special` tokens and the `markup` tokens (never split, not
    special). `pre_tokenizer` defaults to plain byte-level splitting. Deterministic."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizer or pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in markup])
    return tok


def build_tokenizer() -> Tokenizer:
    """Train the tiny tokenizer. Deterministic: equal calls give byte-identical `to_str()`."""
    split = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok = train_byte_level(
        corpus(), VOCAB_SIZE - len(ADDED_TOKENS), SPECIAL_TOKENS, MARKUP_TOKENS, split
    )
    if tok.get_vocab_size() != VOCAB_SIZE:
        raise AssertionError(
            f"tiny tokenizer has {tok.get_vocab_size()} ids, expected {VOCAB_SIZE}"
        )
    return tok


def tokenizer_config(chat_template: str) -> dict[str, Any]:
    """tokenizer_config.json for the tiny tokenizer (Qwen conventions: no BOS, eos <|im_end|>)."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 4096,
        "bos_token": None,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "unk_token": None,
        "add_bos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "chat_template": chat_template,
    }


def token_id(tok: Tokenizer, text: str) -> int:
    tid = tok.token_to_id(text)
    if tid is None:
        raise KeyError(f"{text!r} is not a token of the tiny tokenizer")
    return tid


def save_tokenizer(out_dir: Path, chat_template: str) -> Tokenizer:
    """Write tokenizer.json, tokenizer_config.json and chat_template.jinja into `out_dir`."""
    tok = build_tokenizer()
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    cfg = tokenizer_config(chat_template)
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    (out_dir / "chat_template.jinja").write_text(chat_template, encoding="utf-8")
    return tok
