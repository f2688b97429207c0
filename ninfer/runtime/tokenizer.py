"""The artifact's tokenizer as `LLM.tokenizer`: encode(text) -> ids, decode(ids) -> text."""

from __future__ import annotations

from typing import Any

from tokenizers import Tokenizer as _HFTokenizer


class Tokenizer:
    """Wraps a `tokenizers` JSON. `encode` adds the BOS token when the artifact says so
    (`special_tokens.add_bos`); `decode` drops special tokens unless asked not to."""

    def __init__(self, tokenizer_json: str, special_tokens: dict[str, Any]):
        self._tok = _HFTokenizer.from_str(tokenizer_json)
        self.bos_token_id: int | None = special_tokens.get("bos_token_id")
        self.add_bos = bool(special_tokens.get("add_bos")) and self.bos_token_id is not None
        self.eos_token_ids: tuple[int, ...] = tuple(special_tokens.get("eos_token_ids") or ())

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self.add_bos and (not ids or ids[0] != self.bos_token_id):
            ids = [self.bos_token_id, *ids]  # type: ignore[list-item]
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)
