"""Per-sequence thinking-budget accounting (`Request.thinking_budget`).

A request with a budget starts inside an open thinking block. Every sampled output token is
shown to `ThinkingBudget.observe` in commit order:

    open ── close id ──────────────────────────────▶ closed   (natural </think>: nothing forced)
      └──── budget-th non-closing token, still open ─▶ force  (the scheduler appends the suffix)

Forcing happens at most once: `take_suffix` closes the block and hands back the suffix ids
(guidance + `</think>`), which the scheduler commits to the sequence without sampling, so they
become known tokens the next step computes like any other. Replay after a pause never calls
`observe` again (it recomputes committed tokens, it does not commit new ones).

No torch import.
"""

from __future__ import annotations

from dataclasses import dataclass

from ninfer.runtime.request import Request


@dataclass
class ThinkingBudget:
    """Mutable state of one sequence's budget. `used` counts output tokens written while the
    block was open (the closing token excluded); `forced` is True once the suffix was taken."""

    budget: int
    close_ids: frozenset[int]
    suffix: tuple[int, ...]
    used: int = 0
    open: bool = True
    forced: bool = False

    @classmethod
    def of(cls, request: Request) -> ThinkingBudget | None:
        """The budget state a request starts with, or None when it sets no budget."""
        if request.thinking_budget is None:
            return None
        return cls(
            request.thinking_budget,
            frozenset(request.thinking_close_ids),
            request.thinking_suffix_ids,
        )

    def observe(self, token: int) -> bool:
        """Account one sampled output token. True when the cap is reached with the block still
        open: the caller must then force the suffix (or end the request)."""
        if not self.open:
            return False
        if token in self.close_ids:
            self.open = False
            return False
        self.used += 1
        return self.used >= self.budget

    def take_suffix(self) -> tuple[int, ...]:
        """Close the block and return the suffix to commit (only once)."""
        assert self.open and not self.forced, "the thinking suffix is forced at most once"
        self.open = False
        self.forced = True
        return self.suffix
