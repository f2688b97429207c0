"""What the grammar engine needs to know about a model's tokenizer, built once per engine.

`TokenizerInfo.build(tokenizer_json, eos_token_ids, vocab_size)` wraps llguidance's token trie
(the costly part: about a second for a 150k vocabulary, so the engine builds it once and shares
it between requests). `vocab_size` is the model's logits width (the lm_head rows), which may
exceed the tokenizer's own size; mask rows are `ceil(vocab_size / 32)` int32 words.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import llguidance
from tokenizers import Tokenizer as HFTokenizer

if TYPE_CHECKING:
    from ninfer.artifact.format import Artifact

THINK_END = "</think>"


@dataclass(frozen=True)
class TokenizerInfo:
    """`eos_token_ids`: the ids that end generation (allowed once a constraint is complete);
    `added_tokens`: text -> id of the tokenizer's added tokens (markup such as `<tool_call>` is
    matched as that single token when it is one); `think_end_id`: the `</think>` token that opens
    a constraint when thinking is on, or None when the tokenizer has none."""

    vocab_size: int
    eos_token_ids: tuple[int, ...]
    added_tokens: dict[str, int] = field(repr=False)
    think_end_id: int | None
    ll_tokenizer: llguidance.LLTokenizer = field(repr=False, compare=False)

    @property
    def mask_words(self) -> int:
        """int32 words per bitmask row."""
        return (self.vocab_size + 31) // 32

    @classmethod
    def build(
        cls, tokenizer_json: str, eos_token_ids: tuple[int, ...] | list[int], vocab_size: int
    ) -> TokenizerInfo:
        """From a `tokenizers` JSON, the ids that end generation and the logits width."""
        eos = tuple(int(t) for t in eos_token_ids)
        if not eos:
            raise ValueError("constrained decoding needs at least one EOS token id")
        tok = HFTokenizer.from_str(tokenizer_json)
        if vocab_size < tok.get_vocab_size(with_added_tokens=False):
            raise ValueError(f"vocab_size {vocab_size} is smaller than the tokenizer's vocabulary")
        added = {t.content: int(i) for i, t in tok.get_added_tokens_decoder().items()}
        ll = llguidance.LLTokenizer(
            _without_padding(tokenizer_json), n_vocab=vocab_size, eos_token=list(eos)
        )
        return cls(vocab_size, eos, added, added.get(THINK_END), ll)

    @classmethod
    def from_artifact(cls, artifact: Artifact) -> TokenizerInfo:
        """From a loaded artifact: its tokenizer, EOS ids and logits width (config vocab_size)."""
        eos = tuple(artifact.special_tokens.get("eos_token_ids") or ())
        return cls.build(artifact.tokenizer_json, eos, int(artifact.config["vocab_size"]))


def _without_padding(tokenizer_json: str) -> str:
    """The tokenizer JSON with padding and truncation off (they would alter token bytes)."""
    data = json.loads(tokenizer_json)
    data["padding"] = None
    data["truncation"] = None
    return json.dumps(data)
