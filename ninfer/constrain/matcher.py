"""Per-sequence constraint state: which tokens may come next, and advancing by the sampled one.

    gated ── </think> ──▶ constrained ── EOS ──▶ terminated
    (thinking on: every token but EOS allowed; the constraint has seen nothing yet)

Contract with the sampler: before sampling a row, `fill_mask` writes the row's allowed tokens;
after committing a token (sampled or forced, e.g. a thinking-budget suffix), `advance` is called
with it, in commit order. A token the constraint does not allow makes `advance` return False
without changing the state (`error` says why): the caller must treat that as an internal error,
never emit the token as if it were valid. `rollback(n)` undoes the last n advances (speculative
decoding). Not thread-safe: one sequence, one thread at a time.
"""

from __future__ import annotations

import llguidance
import numpy as np
import torch

from ninfer.constrain.tokenizer_info import TokenizerInfo


class Matcher:
    """One sequence's constraint state (see module docstring). Built by `Constraint.matcher`."""

    def __init__(
        self, engine: llguidance.LLMatcher, info: TokenizerInfo, think_end_id: int | None
    ) -> None:
        self.engine = engine
        self.info = info
        self._think_end = think_end_id
        self.gated = think_end_id is not None
        # per advanced token: "fed" (the engine consumed it), "open" (the </think> that opened
        # the gate) or "gated" (a thinking token the engine never saw)
        self._log: list[str] = []
        self.error = ""

    def fill_mask(self, row: torch.Tensor) -> None:
        """Write the allowed next tokens into `row`, a contiguous CPU int32 tensor of
        `info.mask_words` words (bit j of word w: token 32·w + j)."""
        if row.dtype != torch.int32 or row.device.type != "cpu" or not row.is_contiguous():
            raise ValueError("a mask row is a contiguous CPU int32 tensor")
        if row.numel() != self.info.mask_words:
            raise ValueError(f"a mask row has {self.info.mask_words} words, got {row.numel()}")
        if self.gated:
            words = row.numpy().view(np.uint32)
            words.fill(0xFFFFFFFF)
            for t in self.info.eos_token_ids:  # the answer must still come
                words[t // 32] &= ~np.uint32(1 << (t % 32))
            return
        self.engine.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * 4)

    def allowed_token_ids(self) -> list[int]:
        """The allowed next tokens as ids (for tests and tools; the sampler uses masks)."""
        row = torch.zeros(self.info.mask_words, dtype=torch.int32)
        self.fill_mask(row)
        bits = (row.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
        return torch.nonzero(bits.reshape(-1)[: self.info.vocab_size]).flatten().tolist()

    def advance(self, token_id: int) -> bool:
        """Commit one token. False (state unchanged, `error` set) if it is not allowed."""
        if self.gated:
            if token_id in self.info.eos_token_ids:
                self.error = f"token {token_id} (end of sequence) before the end of thinking"
                return False
            opens = token_id == self._think_end
            self.gated = not opens
            self._log.append("open" if opens else "gated")
            return True
        if token_id in self.info.eos_token_ids:
            # llguidance's validate_tokens refuses EOS once the grammar is stopped; EOS is
            # allowed exactly when the output is complete
            allowed = self.engine.is_accepting() or self.engine.is_stopped()
        else:
            allowed = self.engine.validate_tokens([token_id]) == 1
        if not allowed:
            self.error = f"token {token_id} is not allowed by the constraint here"
            return False
        if not self.engine.consume_token(token_id):
            raise RuntimeError(
                f"grammar engine refused a validated token: {self.engine.get_error()}"
            )
        self._log.append("fed")
        return True

    def rollback(self, n: int) -> None:
        """Undo the last `n` advances; undoing the `</think>` token closes the gate again."""
        if not 0 <= n <= len(self._log):
            raise ValueError(f"cannot roll back {n} of {len(self._log)} tokens")
        undone = self._log[len(self._log) - n :]
        del self._log[len(self._log) - n :]
        fed = undone.count("fed")
        if fed and not self.engine.rollback(fed):
            raise RuntimeError(f"grammar engine could not roll back {fed} tokens")
        if "open" in undone:
            self.gated = True
        self.error = ""

    def is_terminated(self) -> bool:
        """True once the constraint ended (EOS consumed, or nothing more can follow but EOS)."""
        return not self.gated and self.engine.is_stopped()

    def is_accepting(self) -> bool:
        """True when the output so far is complete (the constraint is satisfied if it ends)."""
        return not self.gated and self.engine.is_accepting()
