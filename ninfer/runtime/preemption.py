"""Pausing a resident request under KV pressure, and restoring it: the route, the host budget
and the transfers that carry a snapshot.

    pause     the scheduler takes the youngest resident's lane and pages (scheduler.py decides
              who). Route "snapshot" when the host budget holds its computed pages plus its
              state image: a `SnapshotOut` copies them to host memory before anything reuses
              them. Route "replay" otherwise (or when nothing was computed): only its tokens
              are kept.
    restore   in original order. A snapshot goes back by a `SnapshotIn` into freshly allocated
              pages and the new lane; `computed` is the saved frontier again: nothing is
              recomputed, resampled or republished, and its host bytes are freed. A replay
              recomputes prompt + committed tokens (the prefix cache usually makes it cheap).

    host budget (bytes)   reserve ─▶ [SnapshotOut ran] ─▶ held ─▶ [SnapshotIn ran] ─▶ free
                          └── reserved ──┘                       (or the request ends)
                          └───────────────── used ──────────────────┘

Transfers share the scheduler's ordered list of operations owed to the device with the
`StateCopy`s of checkpoint captures and restores and the `PageCopy`s of sibling choices. Each
is appended when it is decided, so the list runs in the order the bookkeeping assumes: a
pause's snapshot comes before any later write to the pages and lane it gave up, a restore
after the snapshot it reads.

No torch import: the executor does the copies; this file decides and accounts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ninfer.runtime.executor_api import Executor, HostSnapshot
from ninfer.runtime.step import PageCopy, StateCopy

if TYPE_CHECKING:
    from ninfer.runtime.sequence import Sequence

PauseRoute = Literal["snapshot", "replay"]
# ninfer_context_transfer_bytes_total labels (docs/serving.md, "Live metrics")
KV, STATE = "main_kv", "state"
D2H, H2D = "device_to_host", "host_to_device"


@dataclass(eq=False)
class SavedContext:
    """A paused request's host snapshot: positions 0..computed-1 in `num_pages` pages (plus
    the lane's state on a hybrid model), budgeted at `nbytes`. `handle` is the executor's copy
    once the `SnapshotOut` ran; `done` once restored or dropped (budget given back)."""

    computed: int
    num_pages: int
    nbytes: int
    handle: HostSnapshot | None = None
    taken: bool = False
    done: bool = False


@dataclass(frozen=True, eq=False)
class SnapshotOut:
    """Copy `seq`'s pages (and lane state) to host memory into `saved` (device to host)."""

    seq: Sequence
    saved: SavedContext
    page_ids: tuple[int, ...]
    state_slot: int | None


@dataclass(frozen=True, eq=False)
class SnapshotIn:
    """Copy `saved` back into `seq`'s new pages (and lane), then free it (host to device)."""

    seq: Sequence
    saved: SavedContext
    page_ids: tuple[int, ...]
    state_slot: int | None


DeviceOp = StateCopy | PageCopy | SnapshotOut | SnapshotIn


@dataclass
class HostBudget:
    """Host bytes for snapshots. `reserved` (copies not yet run) is included in `used`;
    `peak` is the largest `used` seen."""

    capacity: int
    used: int = 0
    reserved: int = 0
    peak: int = 0

    def reserve(self, n: int) -> bool:
        if self.used + n > self.capacity:
            return False
        self.used += n
        self.reserved += n
        self.peak = max(self.peak, self.used)
        return True

    def settle(self, n: int) -> None:
        """A reserved copy landed: its bytes stay used, no longer reserved."""
        self.reserved -= n

    def free(self, n: int, reserved: bool) -> None:
        self.used -= n
        if reserved:
            self.reserved -= n


class Preemption:
    """Route choice, host budget and transfer accounting (see the module docstring).

    `kv_bytes_per_page` / `state_bytes` are the executor's snapshot sizes (state_bytes 0 for an
    attention-only model); `capacity` (bytes) 0 disables snapshots. `transfer_bytes` totals the
    bytes copied by (resource, direction).
    """

    def __init__(
        self,
        capacity: int,
        kv_bytes_per_page: int,
        state_bytes: int,
        page_size: int,
        is_hybrid: bool,
    ) -> None:
        self.kv_bytes_per_page = kv_bytes_per_page
        self.state_bytes = state_bytes if is_hybrid else 0
        self.page_size = page_size
        self.is_hybrid = is_hybrid
        self.budget = HostBudget(capacity)
        self.transfer_bytes: dict[tuple[str, str], int] = {}
        self._live: set[SavedContext] = set()  # snapshots holding budget

    def save(self, seq: Sequence, ops: list[DeviceOp]) -> PauseRoute:
        """Choose the route for pausing resident `seq` (call while it still holds its pages and
        lane). "snapshot": reserves its bytes, appends a `SnapshotOut` to `ops`, sets
        `seq.saved`. "replay": changes nothing."""
        if seq.computed == 0 or self.budget.capacity == 0:  # nothing to save, or no snapshots
            return "replay"  # (an executor without them reports 0-byte pages: never reserve)
        n = -(-seq.computed // self.page_size)
        nbytes = n * self.kv_bytes_per_page + self.state_bytes
        if not self.budget.reserve(nbytes):
            return "replay"
        saved = SavedContext(seq.computed, n, nbytes)
        self._live.add(saved)
        slot = seq.slot if self.is_hybrid else None
        ops.append(SnapshotOut(seq, saved, tuple(seq.pages[:n]), slot))
        seq.saved = saved
        return "snapshot"

    def restore(self, seq: Sequence, ops: list[DeviceOp]) -> int:
        """Bind-time half of a snapshot restore: `seq` holds a new lane and `saved.num_pages`
        fresh pages; appends the `SnapshotIn` and returns the frontier it brings back."""
        saved = seq.saved
        assert saved is not None and seq.lane is not None
        assert len(seq.pages) == saved.num_pages
        seq.saved = None
        slot = seq.slot if self.is_hybrid else None
        ops.append(SnapshotIn(seq, saved, tuple(seq.pages), slot))
        return saved.computed

    def drop(self, seq: Sequence) -> None:
        """`seq` ends while paused: give its snapshot's bytes back."""
        if seq.saved is not None:
            self._release(seq.saved)
            seq.saved = None

    def abandon(self, op: DeviceOp) -> None:
        """`op` belongs to a failed step: a restore that did not run gives its bytes back."""
        if isinstance(op, SnapshotIn):
            self._release(op.saved)

    def _release(self, saved: SavedContext) -> None:
        if saved.done:
            return
        saved.done = True
        saved.handle = None
        self._live.discard(saved)
        self.budget.free(saved.nbytes, reserved=not saved.taken)

    def run(self, ops: tuple[DeviceOp, ...] | list[DeviceOp], executor: Executor) -> None:
        """Perform `ops` in order through `executor` and account their bytes. A snapshot of a
        request that already ended is skipped (its pages may belong to others by now)."""
        for op in ops:
            if isinstance(op, StateCopy):
                executor.copy_state(op.src_slot, op.dst_slot)
            elif isinstance(op, PageCopy):  # a sibling choice's prompt tail (choices.py)
                executor.copy_page(op.src_page, op.dst_page)
            elif isinstance(op, SnapshotOut):
                saved = op.saved
                if saved.done:
                    continue
                handle = executor.snapshot(op.page_ids, op.state_slot)
                assert handle.nbytes == saved.nbytes, "snapshot size differs from its budget"
                saved.handle, saved.taken = handle, True
                self.budget.settle(saved.nbytes)
                self._count(handle, D2H, op.seq)
            else:  # (no local reference to the handle: a traceback would keep it alive)
                assert op.saved.handle is not None and not op.saved.done, "restore of nothing"
                executor.restore(op.saved.handle, op.page_ids, op.state_slot)
                self._count(op.saved.handle, H2D, op.seq)
                self._release(op.saved)

    def _count(self, handle: HostSnapshot, direction: str, seq: Sequence) -> None:
        """Account a copy that ran: engine-wide bytes, and the request's own (one control
        unit; bytes and operations per resource.direction)."""
        seq.control_units += 1
        for resource, n in ((KV, handle.kv_nbytes), (STATE, handle.state_nbytes)):
            if n:
                key = (resource, direction)
                self.transfer_bytes[key] = self.transfer_bytes.get(key, 0) + n
                own = seq.transfers.setdefault(
                    f"{resource}.{direction}", {"bytes": 0, "operations": 0}
                )
                own["bytes"] += n
                own["operations"] += 1

    def check(self, paused: list[Sequence], pending: list[DeviceOp]) -> None:
        """Invariants (tests): every live snapshot is held by a paused request or a pending
        restore, and the budget adds up."""
        held = [s.saved for s in paused if s.saved is not None]
        held += [op.saved for op in pending if isinstance(op, SnapshotIn)]
        assert set(held) == self._live and len(held) == len(self._live)
        assert self.budget.used == sum(s.nbytes for s in self._live) <= self.budget.capacity
        assert self.budget.reserved == sum(s.nbytes for s in self._live if not s.taken)
