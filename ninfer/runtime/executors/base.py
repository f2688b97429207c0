"""What the CPU reference executor and the CUDA executor share: plan liveness, recurrent-state
slot copies and host snapshots of KV pages and state slots.

A subclass provides `plan`, `kv` (with `.tensors()`, or None), `state` (with `.tensors()` and
`.copy(src, dst)`, or None for attention-only models), `num_pages`, `num_state_slots` and
`is_hybrid`. Snapshot copies run on the tensors' device: synchronously on CPU, asynchronously
on the current stream on CUDA (pinned host buffers; `snapshot.wait()` before reading).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ninfer.runtime.executors.host_snapshot import (
    TensorSnapshot,
    bytes_per_row,
    restore_tensors,
    snapshot_tensors,
)
from ninfer.runtime.executors.kernel_registry import KernelRegistry
from ninfer.runtime.step import StepBatch


class PlanExecutorBase:
    def _liveness(self) -> dict[int, list[str]]:
        """call index -> activations to drop after it (their last reader)."""
        last: dict[str, int] = {}
        for i, c in enumerate(self.plan.calls):
            for n in c.inputs:
                if self.plan.buffers[n].kind == "activation":
                    last[n] = i
        out: dict[int, list[str]] = {}
        for n, i in last.items():
            if n not in self.plan.outputs:
                out.setdefault(i, []).append(n)
        return out

    def _resolve(self, kernels: KernelRegistry) -> None:
        """Look every call's kernels up once (ValueError for a kernel `kernels` lacks)."""
        self.kernels = kernels
        self._step_impls = [kernels.resolve(c, decode=False) for c in self.plan.calls]
        self._decode_impls = [kernels.resolve(c, decode=True) for c in self.plan.calls]

    def _interpret(
        self, ctx: Any, env: dict[str, Any], decode: bool, calls: Sequence[int] | None = None
    ) -> dict[str, Any]:
        """Run the plan's step calls (`calls`: these call indices instead, e.g. the vision
        stage's) in order, each by the kernel the plan names for it (its `decode_kernel` in a
        `decode` step), `impl(ctx, call.attrs, *inputs)`, binding outputs in `env` (weights and
        step inputs on entry) and dropping each activation after its last reader; returns
        `env`."""
        impls = self._decode_impls if decode else self._step_impls
        if calls is None:
            calls = self.plan.step_calls if self.plan.vision is not None else range(len(impls))
        for i in calls:
            call = self.plan.calls[i]
            out = impls[i](ctx, call.attrs, *[env[n] for n in call.inputs])
            if len(call.outputs) == 1:
                env[call.outputs[0]] = out
            else:
                for name, t in zip(call.outputs, out):
                    env[name] = t
            for name in self._last_use.get(i, ()):
                env.pop(name, None)
        return env

    # -- fed tokens ----------------------------------------------------------------------------
    feeds_tokens = True  # run(batch, fed=...) takes a batch's tokens from the device (step.py)

    @staticmethod
    def _feed(tokens: torch.Tensor, batch: StepBatch, fed: torch.Tensor | None) -> None:
        """Write the tokens of a `fed_rows` batch (one decode token per chunk, in chunk order at
        the head of `tokens`) from `fed`, the previous step's sampled ids, on the device."""
        rows = batch.fed_rows
        if not rows:
            return
        if fed is None:
            raise ValueError(f"step {batch.step_index} takes its tokens from the previous step")
        if len(rows) != len(batch.chunks) or any(len(c.token_ids) != 1 for c in batch.chunks):
            raise ValueError("a batch with fed rows is one decode token per chunk")
        n = len(rows)
        if rows == tuple(range(n)):
            tokens[:n].copy_(fed[:n])
        else:
            index = torch.tensor(rows, dtype=torch.long).to(fed.device, non_blocking=True)
            tokens[:n].copy_(fed.index_select(0, index))

    # -- media ---------------------------------------------------------------------------------
    @property
    def merges_media(self) -> bool:
        """Whether the plan's text stage merges vision embeddings (`media_merge`: a vision
        plan, or the MTP head of one); its positions are then 3-axis [3, T]."""
        return "media_embeds" in self.plan.inputs

    def use_media(self, source: Any) -> None:
        """Take the vision embeddings of a plan that merges them but runs no tower of its own
        (an MTP head of a vision plan) from `source`: anything with the media encoder's
        `step_inputs(chunks, hidden)` (ninfer/spec/mtp_media.py)."""
        if not self.merges_media or self.plan.vision is not None:
            raise ValueError(f"plan {self.plan.name} does not take another stage's media")
        self.media = source

    def _no_media(self, batch: StepBatch, hidden: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Empty (media_embeds, media_rows) of a merging plan's step without placeholder rows;
        ValueError when a chunk has media but the executor has no source of embeddings."""
        if any(c.media for c in batch.chunks):
            raise ValueError(f"plan {self.plan.name} runs no vision stage and was given no media")
        empty = torch.empty(0, hidden, dtype=self.dtype, device=self.device)
        return empty, torch.empty(0, dtype=torch.int32, device=self.device)

    # -- state slots ---------------------------------------------------------------------------
    def copy_state(self, src_slot: int, dst_slot: int) -> None:
        """Copy the recurrent state (conv tail + delta-rule state of every linear layer)."""
        if self.state is None:
            raise ValueError("copy_state: this model has no recurrent state")
        self._check_slot(src_slot)
        self._check_slot(dst_slot)
        self.state.copy(src_slot, dst_slot)

    def _check_slot(self, slot: int | None) -> None:
        if slot is None or not 0 <= slot < self.num_state_slots:
            raise ValueError(f"state slot {slot} is outside 0..{self.num_state_slots - 1}")

    # -- KV pages ------------------------------------------------------------------------------
    def copy_page(self, src_page: int, dst_page: int) -> None:
        """Copy KV page `src_page` into `dst_page`: every storage tensor's row (data, and
        scales where the format has them), K and V of every layer; on the tensors' device,
        ordered with the steps (the current stream on CUDA)."""
        bad = [p for p in (src_page, dst_page) if not 0 <= p < self.num_pages]
        if bad:
            raise ValueError(f"pages {bad} are outside 0..{self.num_pages - 1}")
        with torch.inference_mode():
            for t in self._kv_tensors():
                t[dst_page].copy_(t[src_page])

    # -- host snapshots ------------------------------------------------------------------------
    def _kv_tensors(self) -> list[torch.Tensor]:
        return self.kv.tensors() if self.kv is not None else []

    def _state_tensors(self) -> list[torch.Tensor]:
        return self.state.tensors() if self.state is not None else []

    @property
    def kv_bytes_per_page(self) -> int:
        """Host bytes of one page in a snapshot (every attention layer, K and V, with scales)."""
        return bytes_per_row(self._kv_tensors())

    @property
    def state_bytes(self) -> int:
        """Host bytes of one state slot in a snapshot (0 for an attention-only model)."""
        return bytes_per_row(self._state_tensors())

    def _check_snapshot_args(self, page_ids: Sequence[int], slot: int | None) -> None:
        bad = [p for p in page_ids if not 0 <= p < self.num_pages]
        if bad:
            raise ValueError(f"pages {bad} are outside 0..{self.num_pages - 1}")
        if slot is not None:
            self._check_slot(slot)
        elif self.is_hybrid:
            raise ValueError("a hybrid model's snapshot needs its state slot")

    def snapshot(self, page_ids: Sequence[int], state_slot: int | None) -> TensorSnapshot:
        """Copy KV pages `page_ids` and state slot `state_slot` (None: none) to host memory."""
        self._check_snapshot_args(page_ids, state_slot)
        with torch.inference_mode():
            return snapshot_tensors(self._kv_tensors(), page_ids, self._state_tensors(), state_slot)

    def restore(
        self, snapshot: TensorSnapshot, page_ids: Sequence[int], state_slot: int | None
    ) -> None:
        """Copy `snapshot` into pages `page_ids` (in order) and state slot `state_slot`."""
        self._check_snapshot_args(page_ids, state_slot)
        with torch.inference_mode():
            restore_tensors(
                snapshot, self._kv_tensors(), page_ids, self._state_tensors(), state_slot
            )
