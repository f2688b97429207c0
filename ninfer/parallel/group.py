"""Process-group setup for tensor parallelism: one torch.distributed group of every rank for
the model's collectives (nccl on cuda, gloo on cpu, with a timeout, so a rank that stops
answering fails the step instead of hanging it) and one gloo group for rank 0's commands
(pickled objects, waited for as long as the server idles).

Rendezvous: rank 0 serves a TCP store on a free loopback port, starts the workers with that
port, waits until each has connected and said so (or died: no waiting out a timeout for a rank
that never started), then every rank joins the group through the store. Nothing listens
beyond 127.0.0.1.
"""

from __future__ import annotations

import datetime
import os
import pickle
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

HOST = "127.0.0.1"
LOOPBACK_IF = "lo"
COLLECTIVE_TIMEOUT_S = 120.0  # a collective not done by then fails the step (a rank is stuck)
COMMAND_TIMEOUT = datetime.timedelta(days=365)  # workers wait for the next step while idle


@dataclass(frozen=True)
class Rendezvous:
    """Where and how the ranks meet: `world` ranks at rank 0's TCP store on 127.0.0.1:`port`,
    collectives on `device` ("cpu" or "cuda") with `timeout_s`."""

    world: int
    port: int
    device: str
    timeout_s: float = COLLECTIVE_TIMEOUT_S
    first_gpu: int = 0  # cuda: rank r runs on cuda:(first_gpu + r)

    def rank_device(self, rank: int) -> str:
        return "cpu" if self.device == "cpu" else f"cuda:{self.first_gpu + rank}"

    @property
    def backend(self) -> str:
        return "nccl" if self.device == "cuda" else "gloo"


@dataclass(frozen=True)
class Groups:
    data: Any  # the model's collectives (the default group)
    control: Any  # rank 0's commands (gloo)


def serve_store(world: int, timeout_s: float) -> dist.TCPStore:
    """Rank 0's rendezvous store, on a free loopback port the OS picks (`store.port`)."""
    return dist.TCPStore(
        HOST, 0, world, True, datetime.timedelta(seconds=timeout_s), wait_for_workers=False
    )


def join_store(rdv: Rendezvous, timeout_s: float) -> dist.TCPStore:
    """A worker's client of rank 0's store (store operations wait up to `timeout_s`)."""
    return dist.TCPStore(HOST, rdv.port, rdv.world, False, datetime.timedelta(seconds=timeout_s))


def ready_key(rank: int) -> str:
    return f"ninfer/ready/{rank}"


def init_groups(rdv: Rendezvous, rank: int, store: dist.TCPStore) -> Groups:
    """Join the process group as `rank` (every rank calls this; it returns once all have).
    gloo's and NCCL's own sockets stay on the loopback interface unless the environment
    names another (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME)."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", LOOPBACK_IF)
    os.environ.setdefault("NCCL_SOCKET_IFNAME", LOOPBACK_IF)
    device_id = None
    if rdv.device == "cuda":  # NCCL binds each rank to its own GPU (not every rank to cuda:0)
        device_id = torch.device(rdv.rank_device(rank))
        torch.cuda.set_device(device_id)
    dist.init_process_group(
        rdv.backend,
        store=store,
        rank=rank,
        world_size=rdv.world,
        timeout=datetime.timedelta(seconds=rdv.timeout_s),
        device_id=device_id,
    )
    control = dist.new_group(backend="gloo", timeout=COMMAND_TIMEOUT)
    return Groups(dist.group.WORLD, control)


def send_command(groups: Groups, cmd: Any, timeout_s: float) -> None:
    """Rank 0: broadcast `cmd` (pickled, as broadcast_object_list does) on the control group,
    waiting at most `timeout_s` for the workers to take it (a stopped worker would otherwise
    hold rank 0 for ever: gloo's send waits for the receiver)."""
    data = torch.frombuffer(bytearray(pickle.dumps(cmd)), dtype=torch.uint8)
    size = torch.tensor([data.numel()], dtype=torch.int64)
    for t in (size, data):
        work = dist.broadcast(t, src=0, group=groups.control, async_op=True)
        if not work.wait(datetime.timedelta(seconds=timeout_s)):
            raise TimeoutError(f"the workers did not take a command within {timeout_s:g} s")


def receive_command(groups: Groups) -> Any:
    """A worker: the next command rank 0 sends (waits as long as the server idles)."""
    size = torch.zeros(1, dtype=torch.int64)
    dist.broadcast(size, src=0, group=groups.control)
    data = torch.empty(int(size.item()), dtype=torch.uint8)
    dist.broadcast(data, src=0, group=groups.control)
    return pickle.loads(data.numpy().tobytes())


def destroy_groups() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
