"""The artifact's tokenizer as `LLM.tokenizer`: encode(text) -> ids, decode(ids) -> text."""

from __future__ import annotations

from typing import Any

from tokenizers import Tokenizer as _HFTokenizer


class Tokenizer:
    """Wraps a `tokenizers` JSON. `encode` adds special tokens as transformers does: the
    tokenizer's own post-processor decides (e.g. Llama 3's BOS template; a GGUF's add_bos /
    add_eos are written into it at conversion), and a text that already starts with the BOS
    token's text gets a second BOS, as in transformers and llama.cpp. `decode` drops special
    tokens unless asked not to."""

    def __init__(self, tokenizer_json: str, special_tokens: dict[str, Any]):
        self._tok = _HFTokenizer.from_str(tokenizer_json)
        self.bos_token_id: int | None = special_tokens.get("bos_token_id")
        self.eos_token_ids: tuple[int, ...] = tuple(special_tokens.get("eos_token_ids") or ())

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)
