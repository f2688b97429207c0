"""RankGroup: the worker processes of a tensor-parallel engine, seen from rank 0.

    group = RankGroup(world=2, device="cpu")   # spawns rank 1, joins the process group
    group.send("run", batch, False)            # a command every worker runs (worker.py)
    group.close()                              # "stop", join; kill what did not stop

Workers are `python -m ninfer.parallel.worker` subprocesses (their stderr is this process's).
A watchdog thread per worker waits for its exit: a worker that exits while the group
is open fails the group (`failure`), logs which rank died and how, and calls the `on_failure`
callbacks (the server stops itself). After a failure every `send` raises RankFailure at once,
so nothing waits on a rank that is gone; a collective on the survivors fails within the data
group's timeout, or at once when the dead peer's connection closes.

One group per process: torch.distributed's default group is process-wide.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from ninfer.errors import ConfigError
from ninfer.parallel.group import (
    COLLECTIVE_TIMEOUT_S,
    Rendezvous,
    destroy_groups,
    init_groups,
    ready_key,
    send_command,
    serve_store,
)
from ninfer.runtime.request import EngineError

log = logging.getLogger("ninfer.parallel")
STOP_WAIT_S = 10.0  # a worker not gone this long after "stop" is killed
START_TIMEOUT_S = 300.0  # a worker not connected this long after its start fails the group
DEATH_GRACE_S = 2.0  # a failed collective waits this long to see whether a worker died


def _exited(rank: int, pid: int, code: int) -> str:
    return f"tensor-parallel rank {rank} (pid {pid}) exited with code {code}"


class RankFailure(EngineError):
    """A tensor-parallel rank died or a collective failed: the group cannot run any more."""


class RankGroup:
    """The workers of one tensor-parallel engine on `device` ("cpu", or "cuda": rank r on
    cuda:(first_gpu + r)). `timeout_s`: how long a collective or command may wait for the
    other ranks before the step fails (a stuck rank)."""

    def __init__(
        self,
        world: int,
        device: str,
        timeout_s: float = COLLECTIVE_TIMEOUT_S,
        first_gpu: int = 0,
    ):
        if world < 2:
            raise ValueError(f"a rank group needs 2 or more ranks, got {world}")
        if dist.is_initialized():
            raise ConfigError(
                "a tensor-parallel engine is already running in this process; close it first"
            )
        self.world = world
        self.failure: str | None = None
        self._callbacks: list[Callable[[str], None]] = []
        self._closing = False
        self._lock = threading.Lock()
        store = serve_store(world, START_TIMEOUT_S)
        self.rdv = Rendezvous(world, store.port, device, timeout_s, first_gpu)
        threads = max(1, (os.cpu_count() or 1) // world)  # the ranks share the host's cores
        self.procs = [self._start(rank, threads) for rank in range(1, world)]
        try:
            self._await_workers(store, START_TIMEOUT_S)
            self.groups = init_groups(self.rdv, 0, store)
        except BaseException:
            self._kill()
            raise
        self._watchdogs = [
            threading.Thread(target=self._watch, args=(rank, p), daemon=True, name=f"ninfer-rank{rank}-watch")
            for rank, p in enumerate(self.procs, start=1)
        ]  # fmt: skip
        for t in self._watchdogs:
            t.start()

    def _start(self, rank: int, threads: int) -> subprocess.Popen:
        r = self.rdv
        argv = [sys.executable, "-m", "ninfer.parallel.worker", "--rank", str(rank),
                "--world", str(r.world), "--port", str(r.port), "--device", r.device, "--first-gpu", str(r.first_gpu),
                "--parent", str(os.getpid()), "--threads", str(threads),
                "--timeout", str(r.timeout_s)]  # fmt: skip
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL)

    def _await_workers(self, store: Any, timeout_s: float) -> None:
        """Wait until every worker has reached the store; RankFailure naming the first that
        exited instead (its stderr, inherited, says why)."""
        deadline = time.monotonic() + timeout_s
        waiting = dict(enumerate(self.procs, start=1))
        while waiting:
            for rank, p in list(waiting.items()):
                if store.check([ready_key(rank)]):
                    del waiting[rank]
                elif p.poll() is not None:
                    raise RankFailure(
                        f"tensor-parallel rank {rank} (pid {p.pid}) exited with code "
                        f"{p.returncode} while starting"
                    )
            if waiting and time.monotonic() > deadline:
                raise RankFailure(
                    f"tensor-parallel ranks {sorted(waiting)} did not start in {timeout_s:g} s"
                )
            if waiting:
                time.sleep(0.02)

    # -- commands ---------------------------------------------------------------------------
    def send(self, *cmd: Any) -> None:
        """Broadcast command `cmd` to every worker (worker.py lists them)."""
        self.check()
        try:
            send_command(self.groups, cmd, self.rdv.timeout_s)
        except Exception as e:
            raise self.collective_failed(e) from e

    def gather(self, value: Any) -> list[Any]:
        """Every rank's `value` of a command that reports one (rank order)."""
        out: list[Any] = [None] * self.world
        try:
            dist.all_gather_object(out, value, group=self.groups.control)
        except Exception as e:
            raise self.collective_failed(e) from e
        return out

    # -- failure ----------------------------------------------------------------------------
    def check(self) -> None:
        """RankFailure when the group has failed."""
        if self.failure is not None:
            raise RankFailure(self.failure)

    def on_failure(self, callback: Callable[[str], None]) -> None:
        """Call `callback(message)` (from another thread) when the group fails."""
        self._callbacks.append(callback)

    def fail(self, message: str) -> RankFailure:
        """Mark the group failed (the first message wins), tell the callbacks, and return the
        RankFailure to raise."""
        with self._lock:
            first = self.failure is None and not self._closing
            if first:
                self.failure = message
        if first:
            log.error("%s; the engine cannot run any more", message)
            for callback in self._callbacks:
                callback(message)
        return RankFailure(self.failure or message)

    def _watch(self, rank: int, p: subprocess.Popen) -> None:
        code = p.wait()
        if not self._closing:
            self.fail(_exited(rank, p.pid, code))

    def collective_failed(self, error: BaseException) -> RankFailure:
        """Fail the group for a collective (or command broadcast) that raised on rank 0. A dead peer usually shows
        first as a reset connection: when a worker has exited (or exits within
        DEATH_GRACE_S), the failure names it instead."""
        deadline = time.monotonic() + DEATH_GRACE_S
        while True:
            for rank, p in enumerate(self.procs, start=1):
                if p.poll() is not None:
                    return self.fail(_exited(rank, p.pid, p.returncode))
            if time.monotonic() > deadline:
                return self.fail(f"tensor-parallel collective failed on rank 0: {error}")
            time.sleep(0.05)

    # -- shutdown ---------------------------------------------------------------------------
    def close(self) -> None:
        """Stop every worker and leave the process group; idempotent. Workers that do not
        stop within STOP_WAIT_S (or a failed group's survivors) are killed."""
        with self._lock:
            if self._closing:
                return
            failed = self.failure is not None
            self._closing = True
        if not failed:
            try:
                send_command(self.groups, ("stop",), STOP_WAIT_S)
            except Exception:  # noqa: BLE001 - a worker already gone: kill the rest
                failed = True
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(0.0 if failed else STOP_WAIT_S)
        self._kill()
        destroy_groups()

    def _kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
