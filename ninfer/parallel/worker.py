"""The loop of a tensor-parallel worker process (ranks 1..N-1).

Started as `python -m ninfer.parallel.worker` (a fresh interpreter: nothing of the parent's
`__main__` is re-run, so `ninfer.LLM(..., tensor_parallel=N)` needs no `if __name__` guard). A
worker joins the process group, then runs rank 0's commands, each received by a broadcast on
the control group, in order:

    ("load", plans, artifact path, devices)  build this rank's executor for plans[rank];
                                             every rank then reports its KV pages, or its
                                             error (a string)
    ("run", batch, all_logits)               Executor.run (its collectives meet rank 0's)
    ("copy_state", src, dst)                 Executor.copy_state
    ("copy_page", src, dst)                  Executor.copy_page (each rank's own heads)
    ("capture",)                             CUDA: capture the decode CUDA Graphs
    ("unload",)                              drop the executor (its memory)
    ("stop",)                                leave the group and exit 0

Anything failing in a step ends the process with code 1 after logging it: rank 0's watchdog
sees the exit and stops the engine (a rank that lost its step cannot rejoin the lockstep).
A worker whose parent (rank 0's process) is gone exits too, so none is left orphaned.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from typing import Any

import torch
import torch.distributed as dist

from ninfer.parallel.collectives import collective_kernels
from ninfer.parallel.group import (
    Groups,
    Rendezvous,
    destroy_groups,
    init_groups,
    join_store,
    ready_key,
    receive_command,
)

log = logging.getLogger("ninfer.parallel")
PARENT_POLL_S = 1.0
START_TIMEOUT_S = 300.0  # as ranks.py: joining while rank 0 waits for every worker


def make_rank_executor(plan: Any, artifact: Any, device: str, groups: Groups) -> Any:
    """The executor of one rank's plan on `device`, with the collective kernels over the data
    group: the reference CPU executor or the CUDA executor, as for a whole model."""
    kernels = collective_kernels(groups.data)
    if device.startswith("cuda"):
        from ninfer.runtime.executors.cuda.executor import make_executor as make_cuda
        from ninfer.runtime.executors.cuda.ops import CUDA_KERNELS

        torch.cuda.set_device(device)
        return make_cuda(plan, artifact, device, kernels=CUDA_KERNELS.extended(kernels))
    from ninfer.runtime.executors.cpu.executor import CPU_KERNELS, Executor

    return Executor(plan, artifact, device, kernels=CPU_KERNELS.extended(kernels))


def _watch_parent(parent_pid: int) -> None:
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        os._exit(1)  # rank 0 is gone: nothing will ever send another command

    threading.Thread(target=watch, name="ninfer-parent-watch", daemon=True).start()


def serve(rdv: Rendezvous, rank: int) -> None:
    """Join the group as `rank` and run rank 0's commands until "stop"."""
    store = join_store(rdv, START_TIMEOUT_S)
    store.set(ready_key(rank), "1")
    groups = init_groups(rdv, rank, store)
    executor: Any = None
    while True:
        cmd = receive_command(groups)
        op = cmd[0]
        if op == "stop":
            break
        if op == "load":
            executor = None
            report: Any = None
            try:
                from ninfer.artifact import Artifact

                plans, path, devices = cmd[1:]
                executor = make_rank_executor(plans[rank], Artifact(path), devices[rank], groups)
                report = executor.num_pages
            except Exception as e:  # noqa: BLE001 - reported to rank 0, which raises it
                report = f"rank {rank}: {type(e).__name__}: {e}"
            dist.all_gather_object([None] * rdv.world, report, group=groups.control)
        elif op == "run":
            with torch.inference_mode():
                executor.run(cmd[1], all_logits=cmd[2])
        elif op == "copy_state":
            executor.copy_state(cmd[1], cmd[2])
        elif op == "copy_page":
            executor.copy_page(cmd[1], cmd[2])
        elif op == "capture":
            executor.capture_all()
        elif op == "unload":
            executor = None
        else:
            raise ValueError(f"unknown command {op!r}")
    destroy_groups()


def main(argv: list[str] | None = None) -> int:
    """`python -m ninfer.parallel.worker --rank R --world N --port P --device cpu|cuda
    --first-gpu G --parent PID --threads T --timeout S` (RankGroup starts it; not a command
    for users)."""
    p = argparse.ArgumentParser(prog="ninfer.parallel.worker")
    for name, kind in (("rank", int), ("world", int), ("port", int), ("parent", int),
                       ("threads", int), ("timeout", float), ("device", str),
                       ("first-gpu", int)):  # fmt: skip
        p.add_argument(f"--{name}", type=kind, required=True)
    args = p.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format=f"%(asctime)s rank {args.rank} %(message)s"
    )
    _watch_parent(args.parent)
    torch.set_num_threads(args.threads)
    try:
        rdv = Rendezvous(args.world, args.port, args.device, args.timeout, args.first_gpu)
        serve(rdv, args.rank)
    except BaseException:
        log.exception("tensor-parallel rank %d failed", args.rank)
        sys.stderr.flush()
        os._exit(1)  # no clean-up that could wait on the other ranks
    return 0


if __name__ == "__main__":
    sys.exit(main())
