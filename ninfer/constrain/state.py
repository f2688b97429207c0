"""The engine's side of constrained decoding: one matcher per constrained sequence, the step's
token mask filled on the host, and each committed token fed back.

    engine step:  logits = run(batch)                   (queued on the device)
                  mask = state.step_mask(rows)          (host: llguidance, while it runs)
                  sampler.sample_async(logits, rows, mask=mask.apply)
    after commit: verdict = state.advance(seq_id, output_ids)   (sampled and forced tokens)

A row's mask needs its matcher to have seen every token before it, so a step scheduled ahead
(fed the previous step's tokens on the device) samples its constrained rows only once that
previous step is committed; the engine does that (engine.py, `_Launched.logits`).

Masks live in two pinned host buffers used in turn: the copy of step N's mask to the device
may still be queued when step N+1's mask is filled, never when step N+2's is (the engine has at
most two steps in flight, and the one before is committed by then); an event recorded after
each copy makes that explicit. Unconstrained rows of a batch are all ones.

Owned by the engine's worker thread; not thread-safe.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from ninfer.constrain.bitmask import BatchMasks
from ninfer.constrain.compile import Constraint
from ninfer.constrain.matcher import Matcher


class Verdict(NamedTuple):
    """What committing a sequence's new tokens means: `stop` when the constraint is complete
    and nothing may follow (the request finishes with 'stop'); `error` when a committed token
    was refused (the request must fail: it would emit output the constraint forbids)."""

    stop: bool = False
    error: str | None = None


@dataclass
class _Entry:
    matcher: Matcher
    fed: int = 0  # output tokens the matcher has consumed


class StepMask:
    """The mask of one step's logits rows. `dead`: row -> why no token may follow there (the
    grammar cannot continue; the engine fails that request, its row samples from the unmasked
    logits and the token is dropped). `apply(x)` returns x with disallowed tokens at -inf."""

    def __init__(self, buffer: _Buffer, n: int, dead: dict[int, str]) -> None:
        self._buffer = buffer
        self._n = n
        self.dead = dead

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """x: [n, vocab] float logits on any device -> a masked copy (x is not modified)."""
        assert x.dim() == 2 and x.shape[0] == self._n, (x.shape, self._n)
        words = self._buffer.masks.bitmask[: self._n]  # [n, W] int32, pinned when CUDA is present
        vocab = x.shape[1]
        if x.device.type == "cpu":
            allowed = unpack_bits_numpy(words)
        else:
            words = words.to(x.device, non_blocking=True)
            self._buffer.copied(x.device)
            allowed = unpack_bits_torch(words)
        if allowed.shape[1] < vocab:
            allowed = torch.nn.functional.pad(allowed, (0, vocab - allowed.shape[1]))
        return x.masked_fill(~allowed[:, :vocab], float("-inf"))


def unpack_bits_torch(words: torch.Tensor) -> torch.Tensor:
    """int32 [n, W] -> bool [n, 32·W]: bit j of word w is token 32·w + j (on words' device)."""
    shifts = torch.arange(32, dtype=torch.int32, device=words.device)
    return ((words.unsqueeze(-1) >> shifts) & 1).bool().flatten(1)  # [n, W, 32] -> [n, 32·W]


def unpack_bits_numpy(words: torch.Tensor) -> torch.Tensor:
    """`unpack_bits_torch` for CPU words, several times faster: bit j of word w is bit j % 8 of
    little-endian byte 4w + j // 8, which numpy unpacks directly."""
    bits = np.unpackbits(words.numpy().view(np.uint8), axis=1, bitorder="little")
    return torch.from_numpy(bits.view(np.bool_))


class _Buffer:
    def __init__(self, masks: BatchMasks) -> None:
        self.masks = masks
        self._event: torch.cuda.Event | None = None

    def copied(self, device: torch.device) -> None:
        if device.type == "cuda":
            self._event = torch.cuda.Event()
            self._event.record()

    def wait(self) -> None:
        """Before refilling: the last copy out of this buffer has been done."""
        if self._event is not None:
            self._event.synchronize()
            self._event = None


class ConstraintState:
    """Matchers of the engine's constrained sequences, keyed by sequence id, and the reusable
    mask buffers (`max_rows`: the most logits rows one step returns)."""

    def __init__(self, max_rows: int) -> None:
        self.max_rows = max_rows
        self._entries: dict[int, _Entry] = {}
        self._buffers: list[_Buffer] = []
        self._turn = 0

    def __len__(self) -> int:
        return len(self._entries)

    def step_mask(self, rows: Sequence[tuple[int, Constraint | None]]) -> StepMask | None:
        """The mask of a step whose logits row i belongs to sequence rows[i][0], constrained by
        rows[i][1] (None: free). None when no row is constrained. A sequence's matcher starts at
        its first constrained row; rows of a matcher already terminated are free."""
        live: list[Matcher | None] = []
        dead: dict[int, str] = {}
        for i, (seq_id, constraint) in enumerate(rows):
            entry = None if constraint is None else self._entries.get(seq_id)
            if constraint is not None and entry is None:
                entry = self._entries[seq_id] = _Entry(constraint.matcher())
            if entry is not None and entry.matcher.engine.is_error():
                dead[i] = _dead_end(entry.matcher)
            elif entry is not None and not entry.matcher.is_terminated():
                live.append(entry.matcher)
                continue
            live.append(None)
        if all(m is None for m in live) and not dead:
            return None
        buffer = self._buffer(next(c for _, c in rows if c is not None), len(rows))
        buffer.wait()
        bitmask = buffer.masks.bitmask
        for i, m in enumerate(live):
            if m is None:
                bitmask[i].fill_(-1)
        for i in buffer.masks.fill(live):
            if not bool(bitmask[i].any()) or live[i].engine.is_error():  # type: ignore[union-attr]
                dead[i] = _dead_end(live[i])  # type: ignore[arg-type]
                bitmask[i].fill_(-1)  # no all -inf row: its token is dropped with the request
        return StepMask(buffer, len(rows), dead)

    def advance(self, seq_id: int, output_ids: Sequence[int]) -> Verdict:
        """Feed the sequence's output tokens committed since the last call (`output_ids` is its
        whole output so far). A sequence without a matcher yet (nothing sampled under it)
        returns the empty verdict."""
        entry = self._entries.get(seq_id)
        if entry is None:
            return Verdict()
        m = entry.matcher
        if m.engine.is_error():
            return Verdict(error=_dead_end(m))
        for token in output_ids[entry.fed :]:
            if m.is_terminated():
                break
            if not m.advance(int(token)):
                return Verdict(error=f"output token {entry.fed} refused: {m.error}")
            entry.fed += 1
        return Verdict(stop=m.is_terminated())

    def advance_all(
        self, seqs: Iterable[tuple[int, Sequence[int]]]
    ) -> Iterator[tuple[int, Verdict]]:
        """`advance` for each (seq_id, output_ids) of a commit; yields those whose verdict asks
        to finish (stop or error). Sequences without a matcher are skipped."""
        for seq_id, output_ids in seqs:
            if seq_id in self._entries:
                verdict = self.advance(seq_id, output_ids)
                if verdict.stop or verdict.error is not None:
                    yield seq_id, verdict

    def forget(self, seq_id: int) -> None:
        """The sequence finished: drop its matcher."""
        self._entries.pop(seq_id, None)

    def _buffer(self, constraint: Constraint, rows: int) -> _Buffer:
        if rows > self.max_rows:
            raise ValueError(f"a step of {rows} logits rows > {self.max_rows} mask rows")
        info = constraint.info
        if not self._buffers or self._buffers[0].masks.info.mask_words != info.mask_words:
            self._buffers = [_Buffer(BatchMasks(info, self.max_rows)) for _ in range(2)]
        self._turn ^= 1
        return self._buffers[self._turn]


def _dead_end(m: Matcher) -> str:
    error = m.engine.get_error().strip().splitlines() if m.engine.is_error() else []
    return "the constraint allows no next token" + (f" ({error[0]})" if error else "")
