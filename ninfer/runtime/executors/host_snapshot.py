"""Host copies of KV pages and recurrent-state slots, for pausing a request without losing
what it computed (the executors' `snapshot` / `restore`; policy in preemption.py).

Pages are the first dimension of every KV storage tensor, slots of every state tensor::

    KV tensor    [num_pages(+scratch), page_size, kv_heads, X]   (data, or per-token scales)
    snapshot kv  [n, page_size, kv_heads, X]   row i = page page_ids[i]
    state tensor [num_slots(+scratch), ...]  ->  snapshot state [...] of one slot

Runs of consecutive page ids are copied as one slice (no gather buffer on the device). On a
CUDA device the host side is pinned and every copy is asynchronous on the current stream, so
a restore is ordered after the snapshot it reads and before the steps that follow; `wait()`
blocks until a snapshot's device-to-host copies landed (only a host reader needs it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(eq=False)
class TensorSnapshot:
    """`kv[j]` is the copy of KV tensor j ([num_pages, ...] in page_ids order), `state[j]` of
    state tensor j at one slot; tensor order is the executor's fixed order."""

    kv: list[torch.Tensor]
    state: list[torch.Tensor]
    num_pages: int
    has_state: bool
    done: Any = None  # torch.cuda.Event recorded after the device-to-host copies, or None

    @property
    def kv_nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.kv)

    @property
    def state_nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.state)

    @property
    def nbytes(self) -> int:
        return self.kv_nbytes + self.state_nbytes

    def wait(self) -> None:
        if self.done is not None:
            self.done.synchronize()


def page_runs(page_ids: Sequence[int]) -> list[tuple[int, int, int]]:
    """(index into page_ids, first page, length) of each run of consecutive ascending ids."""
    runs: list[tuple[int, int, int]] = []
    for i, p in enumerate(page_ids):
        if runs and runs[-1][1] + runs[-1][2] == p:
            at, first, n = runs[-1]
            runs[-1] = (at, first, n + 1)
        else:
            runs.append((i, p, 1))
    return runs


def bytes_per_row(tensors: Sequence[torch.Tensor]) -> int:
    """Bytes of one index of the first dimension, summed over `tensors` (a page, a slot)."""
    return sum(t[0].numel() * t.element_size() for t in tensors)


def _host_empty(like: torch.Tensor, shape: tuple[int, ...]) -> tuple[torch.Tensor, bool]:
    """An uninitialised host tensor shaped `shape`, pinned (and so async-copyable) when
    `like` lives on a CUDA device; returns it and whether it is pinned."""
    pinned = like.device.type == "cuda"
    return torch.empty(shape, dtype=like.dtype, device="cpu", pin_memory=pinned), pinned


def snapshot_tensors(
    kv: Sequence[torch.Tensor],
    page_ids: Sequence[int],
    state: Sequence[torch.Tensor],
    slot: int | None,
) -> TensorSnapshot:
    """Copy rows `page_ids` of every `kv` tensor and row `slot` of every `state` tensor (None:
    no state) to host memory."""
    runs = page_runs(page_ids)
    kv_out = []
    for t in kv:
        host, pinned = _host_empty(t, (len(page_ids), *t.shape[1:]))
        for at, first, n in runs:
            host[at : at + n].copy_(t[first : first + n], non_blocking=pinned)
        kv_out.append(host)
    state_out = []
    if slot is not None:
        for t in state:
            host, pinned = _host_empty(t, tuple(t.shape[1:]))
            host.copy_(t[slot], non_blocking=pinned)
            state_out.append(host)
    done = None
    cuda = [t.device for t in (*kv, *state) if t.device.type == "cuda"]
    if cuda:
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(cuda[0]))
    return TensorSnapshot(kv_out, state_out, len(page_ids), slot is not None, done)


def restore_tensors(
    snap: TensorSnapshot,
    kv: Sequence[torch.Tensor],
    page_ids: Sequence[int],
    state: Sequence[torch.Tensor],
    slot: int | None,
) -> None:
    """Copy `snap` into rows `page_ids` of the `kv` tensors and row `slot` of the `state`
    tensors (the same tensors, in the same order, as it was taken from)."""
    if len(page_ids) != snap.num_pages or len(kv) != len(snap.kv):
        raise ValueError(
            f"restore: the snapshot holds {snap.num_pages} pages, {len(page_ids)} were given"
        )
    if snap.has_state != (slot is not None):
        raise ValueError("restore: a state slot must be given exactly when the snapshot has state")
    runs = page_runs(page_ids)
    for t, host in zip(kv, snap.kv):
        pinned = t.device.type == "cuda"  # the snapshot was taken from these tensors
        for at, first, n in runs:
            t[first : first + n].copy_(host[at : at + n], non_blocking=pinned)
    if slot is not None:
        for t, host in zip(state, snap.state, strict=True):
            t[slot].copy_(host, non_blocking=t.device.type == "cuda")
