"""A GGUF file's tokenizer metadata -> a `tokenizers` JSON, chat template and special tokens.

A GGUF carries no tokenizer.json: llama.cpp stores the vocabulary (`tokenizer.ggml.tokens`),
the BPE merges, a type per token (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused,
6 byte), the special ids and a pre-tokenizer name (`tokenizer.ggml.pre`). This module rebuilds
the tokenizer those describe so it encodes exactly as transformers' GGUF tokenizer
(`AutoTokenizer.from_pretrained(dir, gguf_file=...)`), which is the reference the tests use:

- byte-level BPE (`tokenizer.ggml.model == "gpt2"`): no normalizer; the pre-tokenizer splits
  with the regex named by `tokenizer.ggml.pre` (the GPT-2 regex inside `ByteLevel` when the name
  is not one we know, as transformers does), then maps bytes to the GPT-2 alphabet;
- SentencePiece BPE (`tokenizer.ggml.model == "llama"`): Metaspace ("▁" prepended to the first
  word), byte fallback to the `<0xNN>` tokens, merges from the file or, when it lists none,
  derived from the vocabulary and its scores;
- control tokens (type 3) and the bos/eos/unk/pad tokens become special added tokens,
  user-defined ones (type 4) plain added tokens, so chat markup such as `<|im_start|>` stays one
  id; BOS (and EOS) are added by the post-processor exactly when the file asks for it.

Any other tokenizer model is a one-line ConvertError.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ninfer.errors import ConvertError

# llama.cpp token types
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED = 1, 2, 3, 4

# Split regexes of the pre-tokenizers llama.cpp names in `tokenizer.ggml.pre`.
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN35 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Mistral's tekken and the gpt-4o family: cased letter runs, and digits one / up to three at a time
_CASED = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+{s}"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*{s}"
    r"|{n}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN = _CASED.replace("{s}", "").replace("{n}", r"\p{N}")
_GPT4O = _CASED.replace("{s}", r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?").replace("{n}", r"\p{N}{1,3}")
# names llama.cpp writes in tokenizer.ggml.pre; any other takes the GPT-2 split (as transformers)
SPLIT_REGEX: dict[str, str] = {
    **dict.fromkeys(
        ("llama3", "llama-v3", "llama-bpe", "smaug-bpe", "dbrx", "falcon3", "falcon-h1",
         "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"),
        _LLAMA3,
    ),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "megrez", "f2llmv2"), _QWEN2),
    "qwen35": _QWEN35,
    "tekken": _TEKKEN,
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), _GPT4O),
}  # fmt: skip

# End-of-turn markers a chat model stops on, besides the file's eos id, when it has them.
_END_OF_TURN = (
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
)


@dataclass(frozen=True)
class GGUFTokenizer:
    """What the artifact header needs from a GGUF's tokenizer metadata."""

    tokenizer_json: str  # loadable with tokenizers.Tokenizer.from_str
    chat_template: str | None
    special_tokens: dict[str, Any]  # the artifact's `special_tokens` header field
    vocab_size: int


def byte_alphabet() -> dict[int, str]:
    """The GPT-2 byte -> printable character map byte-level BPE spells its tokens in.

    Printable Latin-1 bytes stand for themselves; the 68 others take 256, 257, ... in byte order.
    """
    keep = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table: dict[int, str] = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return dict(sorted(table.items()))


def _byte_level_json(
    meta: Mapping[str, Any], tokens: list[str], types: list[int], add_bos: bool
) -> dict[str, Any]:
    alphabet = byte_alphabet()
    letters = set(alphabet.values())
    vocab: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        # A token written in plain text (outside the byte alphabet) is respelled byte by byte.
        spelled = tok if set(tok) <= letters else "".join(alphabet[b] for b in tok.encode("utf-8"))
        vocab[spelled] = i
    merges = [m.split(" ") for m in meta.get("tokenizer.ggml.merges") or []]

    added = _special_added(meta, tokens, types, vocab, byte_level=True)

    pre = meta.get("tokenizer.ggml.pre")
    byte_level = {
        "type": "ByteLevel",
        "add_prefix_space": False,
        "trim_offsets": True,
        "use_regex": True,
    }
    if pre in SPLIT_REGEX:
        pre_tokenizer: dict[str, Any] = {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": SPLIT_REGEX[pre]},
                    "behavior": "Isolated",
                    "invert": False,
                },
                dict(byte_level, use_regex=False),
            ],
        }
    else:
        pre_tokenizer = byte_level
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": _post_processor(meta, tokens, add_bos),
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": True,
            "trim_offsets": True,
            "use_regex": True,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": merges,
        },
    }


def _added(token_id: int, content: str, *, special: bool) -> dict[str, Any]:
    return {
        "id": token_id,
        "content": content,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": special,
    }


def _post_processor(meta: Mapping[str, Any], tokens: list[str], add_bos: bool) -> dict[str, Any]:
    """BOS is prepended (and EOS appended) by the tokenizer itself exactly when the file asks
    for it (add_bos as the caller resolved it, tokenizer.ggml.add_eos_token)."""

    def special(key: str, wanted: Any) -> tuple[int, str] | None:
        i = meta.get(f"tokenizer.ggml.{key}")
        return (i, tokens[i]) if wanted and isinstance(i, int) and 0 <= i < len(tokens) else None

    def wrap(seq: str, type_id: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = [{"Sequence": {"id": seq, "type_id": type_id}}]
        if bos is not None:
            out.insert(0, {"SpecialToken": {"id": bos[1], "type_id": type_id}})
        if eos is not None:
            out.append({"SpecialToken": {"id": eos[1], "type_id": type_id}})
        return out

    bos = special("bos_token_id", add_bos)
    eos = special("eos_token_id", meta.get("tokenizer.ggml.add_eos_token"))
    single, pair = wrap("A", 0), wrap("A", 0) + wrap("B", 1)
    specials = {t: {"id": t, "ids": [i], "tokens": [t]} for i, t in filter(None, (bos, eos))}
    return {
        "type": "TemplateProcessing",
        "single": single,
        "pair": pair,
        "special_tokens": specials,
    }


def _special_tokens(
    meta: Mapping[str, Any], tokens: list[str], types: list[int], add_bos: bool
) -> dict[str, Any]:
    def tok(key: str) -> tuple[int | None, str | None]:
        i = meta.get(f"tokenizer.ggml.{key}")
        if isinstance(i, int) and 0 <= i < len(tokens):
            return i, tokens[i]
        return None, None

    bos_id, bos = tok("bos_token_id")
    eos_id, eos = tok("eos_token_id")
    pad_id, _ = tok("padding_token_id")
    eos_ids: list[int] = [eos_id] if eos_id is not None else []
    for key in ("eot_token_id", "eom_token_id"):
        i, _ = tok(key)
        if i is not None and i not in eos_ids:
            eos_ids.append(i)
    index = {t: i for i, t in enumerate(tokens) if types[i] in (TOKEN_CONTROL, TOKEN_USER_DEFINED)}
    for marker in _END_OF_TURN:
        i = index.get(marker)
        if i is not None and i not in eos_ids:
            eos_ids.append(i)
    return {
        "bos_token": bos,
        "bos_token_id": bos_id,
        "eos_token": eos,
        "eos_token_ids": eos_ids,
        "pad_token_id": pad_id,
        "add_bos": add_bos,
    }


def _special_added(
    meta: Mapping[str, Any],
    tokens: list[str],
    types: list[int],
    vocab: dict[str, int],
    byte_level: bool,
) -> list[dict[str, Any]]:
    """Added tokens: control tokens and the bos/eos/unk/pad tokens as special ones, user-defined
    tokens as plain ones, so each stays whole in any text."""
    letters = set(byte_alphabet().values()) if byte_level else None
    added: dict[str, dict[str, Any]] = {}
    for tok, kind in zip(tokens, types):
        # In a byte-level vocabulary a control token outside the byte alphabet is a mislabel.
        if kind == TOKEN_CONTROL and (letters is None or set(tok) <= letters) and tok in vocab:
            added.setdefault(tok, _added(vocab[tok], tok, special=True))
    for key in ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id"):
        i = meta.get(f"tokenizer.ggml.{key}")
        if isinstance(i, int) and 0 <= i < len(tokens) and tokens[i] in vocab:
            added.setdefault(tokens[i], _added(vocab[tokens[i]], tokens[i], special=True))
    for tok, kind in zip(tokens, types):
        if kind == TOKEN_USER_DEFINED and tok in vocab:
            added.setdefault(tok, _added(vocab[tok], tok, special=False))
    return sorted(added.values(), key=lambda a: a["id"])


def spm_merges(tokens: list[str], scores: list[float]) -> list[list[str]]:
    """BPE merges implied by a SentencePiece vocabulary that lists none.

    Every token that splits into two tokens of the vocabulary yields the merge of those halves;
    merges of a higher-scored token come first (ties: longer left, then longer right half, then
    file order), and the halves of one token are ordered by their ids.
    """
    vocab = {t: i for i, t in enumerate(tokens)}
    score_of = dict(zip(tokens, scores))
    found: list[tuple[str, str, float]] = []
    for tok, score in score_of.items():
        pairs = [
            (tok[:k], tok[k:]) for k in range(1, len(tok)) if tok[:k] in vocab and tok[k:] in vocab
        ]
        pairs.sort(key=lambda p: (vocab[p[0]], vocab[p[1]]))
        found.extend((left, right, score) for left, right in pairs)
    found.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)  # stable: ties keep order
    return [[left, right] for left, right, _ in found]


def _sentencepiece_json(
    meta: Mapping[str, Any], tokens: list[str], types: list[int], add_bos: bool
) -> dict[str, Any]:
    vocab = {t: i for i, t in enumerate(tokens)}
    if meta.get("tokenizer.ggml.merges"):
        merges = [m.split(" ") for m in meta["tokenizer.ggml.merges"]]
    else:
        scores = list(meta.get("tokenizer.ggml.scores") or [0.0] * len(tokens))
        merges = spm_merges(tokens, [float(x) for x in scores])
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": _special_added(meta, tokens, types, vocab, byte_level=False),
        "normalizer": None,
        # transformers' GGUF reference always prepends "▁" to the first word (it does not read
        # tokenizer.ggml.add_space_prefix); we follow it.
        "pre_tokenizer": {
            "type": "Metaspace",
            "replacement": "▁",
            "prepend_scheme": "first",
            "split": False,
        },
        "post_processor": _post_processor(meta, tokens, add_bos),
        "decoder": {
            "type": "Sequence",
            "decoders": [
                {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
                {"type": "Strip", "content": " ", "start": 1, "stop": 0},
            ],
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": True,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": merges,
        },
    }


def gguf_tokenizer(meta: Mapping[str, Any]) -> GGUFTokenizer:
    """Build the tokenizer a GGUF's metadata describes.

    `meta` maps GGUF keys to Python values (`tokenizer.ggml.tokens` a list of str, ...), as
    `convert_gguf.read_metadata` returns them. Raises ConvertError (one line) when the file has
    no tokenizer or a tokenizer model other than byte-level BPE ("gpt2") or SentencePiece BPE
    ("llama").
    """
    model = meta.get("tokenizer.ggml.model")
    tokens = meta.get("tokenizer.ggml.tokens")
    if model is None or not tokens:
        raise ConvertError(
            "the GGUF file has no tokenizer (tokenizer.ggml.model / tokenizer.ggml.tokens missing)"
        )
    tokens = list(tokens)
    types = list(meta.get("tokenizer.ggml.token_type") or [TOKEN_NORMAL] * len(tokens))
    if len(types) != len(tokens):
        raise ConvertError(
            f"the GGUF tokenizer has {len(tokens)} tokens but {len(types)} token types"
        )
    if model == "gpt2":
        add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False))
        data = _byte_level_json(meta, tokens, types, add_bos)
    elif model == "llama":
        # llama.cpp adds BOS to a SentencePiece vocabulary unless the file says otherwise
        add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", True))
        data = _sentencepiece_json(meta, tokens, types, add_bos)
    else:
        raise ConvertError(
            f"unsupported GGUF tokenizer model {model!r} (supported: 'gpt2' byte-level BPE, 'llama' SentencePiece)"
        )
    template = meta.get("tokenizer.chat_template")
    return GGUFTokenizer(
        tokenizer_json=json.dumps(data, ensure_ascii=False),
        chat_template=template if isinstance(template, str) else None,
        special_tokens=_special_tokens(meta, tokens, types, add_bos),
        vocab_size=len(tokens),
    )
