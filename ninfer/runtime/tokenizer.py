"""The artifact's tokenizer as `LLM.tokenizer`: encode(text) -> ids, decode(ids) -> text."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tokenizers import Tokenizer as _HFTokenizer

_EOS_SPELLINGS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>")


def eos_token_ids(special_tokens: Mapping[str, Any], tokenizer: _HFTokenizer) -> tuple[int, ...]:
    """The token ids that end a generation: the artifact's `eos_token_ids`, plus the id of its
    `eos_token` text when that is a known end-of-turn spelling missing from the list; with
    neither, `<|im_end|>` when the vocabulary has it. The engine, the server and `ninfer.LLM`
    all stop on exactly these."""
    ids = [i for i in special_tokens.get("eos_token_ids") or () if isinstance(i, int)]
    for text in _EOS_SPELLINGS:
        tid = tokenizer.token_to_id(text)
        if tid is not None and tid not in ids and text == special_tokens.get("eos_token"):
            ids.append(tid)
    if not ids:
        tid = tokenizer.token_to_id("<|im_end|>")
        if tid is not None:
            ids.append(tid)
    return tuple(ids)


class Tokenizer:
    """Wraps a `tokenizers` JSON. `encode` adds special tokens as transformers does: the
    tokenizer's own post-processor decides (e.g. Llama 3's BOS template; a GGUF's add_bos /
    add_eos are written into it at conversion), and a text that already starts with the BOS
    token's text gets a second BOS, as in transformers and llama.cpp. `decode` drops special
    tokens unless asked not to."""

    def __init__(self, tokenizer_json: str, special_tokens: dict[str, Any]):
        self._tok = _HFTokenizer.from_str(tokenizer_json)
        self.bos_token_id: int | None = special_tokens.get("bos_token_id")
        self.eos_token_ids: tuple[int, ...] = eos_token_ids(special_tokens, self._tok)

    @property
    def hf(self) -> _HFTokenizer:
        """The underlying `tokenizers.Tokenizer` (what the server's text pieces take)."""
        return self._tok

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)
