"""The reference executor: interprets a plan with torch ops over a paged KV cache and
recurrent-state slots. The only code that runs a model.

Protocol (what the engine relies on; see ninfer/runtime/step.py):

    ex = Executor(plan, artifact)
    ex.num_pages, ex.page_size, ex.num_state_slots, ex.is_hybrid
    logits = ex.run(batch)          # [rows with want_logits, vocab] float32, in chunk order
    ex.hidden                       # captured hidden states of the last run (plan capture)
    ex.copy_state(src_slot, dst_slot)
    ex.tokens_computed              # tokens run through the model since construction
    snap = ex.snapshot(page_ids, state_slot)    # host copy (ex.kv_bytes_per_page per page
    ex.restore(snap, page_ids, state_slot)      # + ex.state_bytes), copied back elsewhere

`run` first applies `batch.state_copies` in order, then resets the state slot of every chunk
that starts at position 0 (a fresh sequence), then runs every call of the plan once over all
the step's tokens. It writes each chunk's K/V into the pages its block table names and
advances each chunk's state slot; it mutates nothing else. Pages and slots are owned by the
caller (scheduler or `LLM`): the executor never allocates or frees them.

With a vision plan (`plan.vision`, --vision) positions are 3-axis (each chunk's `mrope`), and
`ex.media` (ninfer/runtime/executors/vision/encoder.py) runs the plan's vision calls once per image or
video of the chunks' `media` and supplies the embeddings of the placeholder rows a step
computes; the vision stage's output is the plan's second output. The MTP head of a vision plan
merges media too but has no tower: its `media` is the target's, attached with `use_media`.

Every call runs the kernel the plan names for it, looked up in CPU_KERNELS: the torch
references of ninfer.runtime.executors.cpu.ops under the names assign_kernels gives them on cpu
(`torch.<op>`, `view.split`). A plan compiled for cuda names kernels this executor does not
have and is refused at construction (run it with ninfer.runtime.executors.cuda.executor).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from ninfer.artifact.format import Artifact
from ninfer.ir.plan import Plan
from ninfer.passes.assign_kernels import (
    CPU_PACKED_GEMMS,
    CPU_PACKED_LOGITS,
    CPU_PACKED_ROWS,
    cpu_kernel,
)
from ninfer.runtime.executors.base import PlanExecutorBase
from ninfer.runtime.executors.cpu.kv_cache import PagedKVCache, StateSlots
from ninfer.runtime.executors.cpu.ops import OPS, ChunkView, StepContext
from ninfer.runtime.executors.cpu.weights import TORCH_DTYPES, load_weights
from ninfer.runtime.executors.kernel_registry import KernelRegistry
from ninfer.runtime.executors.vision.encoder import MediaEncoder
from ninfer.runtime.executors.vision.ops import VISION_OPS, VisionContext
from ninfer.runtime.step import StepBatch

# the names assign_kernels gives cpu ops: the reference of each op kind, views as view.split,
# and the packed GGUF kernels (kernels/cpu_quant.py) of cpu_weights="packed": the same ops run
# them for a weight loaded packed (runtime/executors/cpu/weights.py packs only weights those kernels read)
CPU_KERNELS = KernelRegistry(
    "cpu",
    {
        **{(cpu_kernel(op), op): impl for op, impl in {**OPS, **VISION_OPS}.items()},
        **{(name, "linear"): OPS["linear"] for name in CPU_PACKED_GEMMS.values()},
        (CPU_PACKED_LOGITS, "logits"): OPS["logits"],
        (CPU_PACKED_ROWS, "embed"): OPS["embed"],
    },
)


class Executor(PlanExecutorBase):
    def __init__(
        self,
        plan: Plan,
        artifact: Artifact,
        device: str | torch.device = "cpu",
        *,
        kernels: KernelRegistry | None = None,
    ):
        self.plan = plan
        self._resolve(kernels or CPU_KERNELS)
        self.device = torch.device(device)
        self.dtype = TORCH_DTYPES[plan.dtype]
        self.weights = load_weights(plan, artifact, self.device)
        self.kv = PagedKVCache(plan.kv, self.dtype, self.device)
        self.is_hybrid = bool(plan.state.layers)
        self.num_state_slots = plan.state.slots if self.is_hybrid else 0
        self.state = (
            StateSlots(plan.caches, self.num_state_slots, self.dtype, self.device)
            if self.is_hybrid
            else None
        )
        self._rope: dict[str, torch.Tensor] = {}
        self._last_use = self._liveness()
        self.media = MediaEncoder.for_plan(plan, self._vision_stage, self.dtype, self.device)
        self.last_step_seconds = 0.0
        # positions computed by `run` since construction (every chunk token, prefill or decode;
        # state copies excluded): tests read deltas of it to prove prefix reuse skipped work
        self.tokens_computed = 0
        # hidden states the plan captures (CompileOptions.capture): name ("final", "L{i}") ->
        # output; after each `run`, `hidden[name]` holds [T, hidden], one row per token of the
        # step in chunk order (as the batch's tokens), for drafters that read them
        self._capture: dict[str, str] = dict(plan.model.get("capture") or {})
        self.hidden: dict[str, torch.Tensor] = {}

    @property
    def num_pages(self) -> int:
        return self.kv.num_pages

    @property
    def page_size(self) -> int:
        return self.kv.page_size

    @property
    def vocab_size(self) -> int:
        return int(self.plan.model["vocab"])

    @torch.inference_mode()
    def run(
        self,
        batch: StepBatch,
        all_logits: bool = False,
        fed: torch.Tensor | None = None,
        inputs: dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Run one step. Returns float32 logits [rows, vocab]: for each chunk with
        want_logits its last `num_logits` positions (one row, or k + 1 for a verify chunk), in
        chunk order; with `all_logits`, every position of
        every chunk instead (used by `LLM.logits`). `fed`: the previous step's sampled ids,
        for a batch with `fed_rows`. `inputs`: step inputs a stage's plan has beyond tokens and
        positions (an MTP head's `hidden` [T, hidden], rows in chunk order)."""
        t0 = time.perf_counter()
        for cp in batch.state_copies:
            self.copy_state(cp.src_slot, cp.dst_slot)
        chunks: list[ChunkView] = []
        tokens: list[int] = []
        positions: list[int] = []
        axes: tuple[list[int], list[int], list[int]] = ([], [], [])  # MRoPE plans
        rows: list[int] = []
        for c in batch.chunks:
            n = len(c.token_ids)
            if n < 1:
                raise ValueError(f"sequence {c.seq_id}: empty chunk")
            if self.is_hybrid:
                self._check_slot(c.state_slot)
                if c.start_pos == 0:
                    self.state.reset([c.state_slot])  # type: ignore[union-attr]
            begin = len(tokens)
            if c.spill_slots:
                for slot in c.spill_slots:
                    self._check_slot(slot)
                if len(c.spill_slots) != n:
                    raise ValueError(
                        f"sequence {c.seq_id}: {n} tokens but {len(c.spill_slots)} spill slots"
                    )
            view = ChunkView(
                begin, n, c.start_pos, tuple(c.block_table), c.state_slot, c.spill_slots
            )
            chunks.append(view)
            tokens.extend(c.token_ids)
            if not self.merges_media:
                positions.extend(range(c.start_pos, c.start_pos + n))
            else:
                pos3 = (
                    c.mrope.positions(c.start_pos, n)
                    if c.mrope
                    else [range(c.start_pos, c.start_pos + n)] * 3
                )
                for axis, p in zip(axes, pos3):
                    axis.extend(p)
            if all_logits:
                rows.extend(range(begin, begin + n))
            elif c.want_logits:  # the last num_logits positions (1, or k + 1 to verify)
                rows.extend(range(begin + n - min(c.num_logits, n), begin + n))
        env: dict[str, Any] = dict(self.weights)
        env["tokens"] = torch.tensor(tokens, dtype=torch.int32, device=self.device)
        self._feed(env["tokens"], batch, fed)
        if not self.merges_media:
            env["positions"] = torch.tensor(positions, dtype=torch.int32, device=self.device)
        else:  # 3-axis positions [3, T] and the vision embeddings of the placeholder rows
            env["positions"] = torch.tensor(axes, dtype=torch.int32, device=self.device)
            begins = [(v.begin, c) for v, c in zip(chunks, batch.chunks)]
            hidden = int(self.plan.model["hidden"])
            env["media_embeds"], env["media_rows"] = (
                self._no_media(batch, hidden)
                if self.media is None
                else self.media.step_inputs(begins, hidden)
            )
        env["logit_rows"] = torch.tensor(rows, dtype=torch.int32, device=self.device)
        for name, value in (inputs or {}).items():
            if name not in self.plan.inputs or name in env:
                raise ValueError(f"step input {name!r} is not an extra input of this plan")
            if value.shape[0] != len(tokens):
                raise ValueError(
                    f"step input {name!r}: {value.shape[0]} rows for {len(tokens)} tokens"
                )
            env[name] = value.to(self.device, self.dtype)
        ctx = StepContext(chunks, self.kv, self.state, self._rope)
        env = self._interpret(ctx, env, decode=False)
        self.last_step_seconds = time.perf_counter() - t0
        self.tokens_computed += batch.num_tokens
        self.hidden = {name: env[out] for name, out in self._capture.items()}
        return env[self.plan.outputs[0]]

    def _vision_stage(self, ctx: VisionContext, inputs: dict[str, Any]) -> dict[str, Any]:
        """Run the plan's vision calls once over one item's inputs (MediaEncoder's runner)."""
        return self._interpret(ctx, {**self.weights, **inputs}, False, self.plan.vision_calls)


def executor_for(path: str, **options: Any) -> Executor:
    """Compile the artifact at `path` with CompileOptions(**options) and load an Executor."""
    from ninfer.passes.options import CompileOptions
    from ninfer.passes.pipeline import compile_artifact

    artifact = Artifact(path)
    return Executor(compile_artifact(artifact, CompileOptions(**options)), artifact)
