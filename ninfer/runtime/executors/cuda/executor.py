"""The CUDA executor: runs a cuda plan with the Triton kernels of kernels/, decode steps
replayed from CUDA Graphs.

Same protocol and the same function as the reference executor (ninfer/runtime/executors/cpu/executor.py):

    ex = CudaExecutor(plan, artifact)       # or make_executor(plan, artifact, device)
    ex.num_pages, ex.page_size, ex.num_state_slots, ex.is_hybrid
    logits = ex.run(batch)                  # [rows with want_logits, vocab] float32, on the GPU
    ex.hidden                               # captured hidden states of the last run (capture)
    ex.copy_state(src_slot, dst_slot)
    ex.tokens_computed                      # tokens run through the model since construction
    snap = ex.snapshot(page_ids, slot)      # pinned host copy, async on the current stream
    ex.restore(snap, page_ids, slot)        # back into other pages / slot, stream-ordered

What happens once, at construction:
  - weights are uploaded (weights.py: fp8/nvfp4 GEMM weights stay packed, the rest in the
    compute dtype), the KV pool and state slots are allocated (kv_cache.py); with
    kv_capacity="auto" the pool takes the free memory left after weights, the planned
    workspace and state, minus 1 GiB, capped at the plan's pool (what the lanes can use).

Per step:
  - host metadata (tokens, positions, KV slots, block tables, sequence lengths, chunk
    boundaries, state slots, logit rows) is packed into one int32 array and copied once;
  - a decode step (every chunk one token, all wanting logits) of n rows, n in the plan's CUDA
    Graph buckets, replays graph n: captured on first use against a scratch KV page and state
    slot, replayed after copying the step's metadata into the graph's input buffer;
  - a speculative verify step (chunks of the fed token and k drafts wanting every position's
    logits, beside plain decode rows) of an attention-only model runs as a decode step of one
    row per verified position, when those rows fit a decode bucket: row i of a sequence writes
    its KV in the layer's prologue before the attention kernel reads positions <= its own, so
    k + 1 rows compute what the k+1-token chunk would, from the decode kernels and graphs;
  - a verify step of a hybrid model runs eagerly as chunks: each verify chunk's GDN layers
    write the state after its position t into round slot spill_slots[t] (DeviceStep);
  - any other step (prefill, mixed, `all_logits`, --no-cuda-graph) runs eagerly;
  - `run_chain` (a drafter's round, chain.py): decode steps feeding each other on the device,
    replayed as one graph.

With a vision plan (--vision) positions are 3-axis [3, T] (each chunk's `mrope`, decode rows
included: their rope delta), rotated by torch.rotary_mrope; a step whose chunks cover image or
video placeholders runs eagerly, and `ex.media` (ninfer/runtime/executors/vision/encoder.py) runs the
plan's vision calls once per item on the device and supplies the embeddings `media_merge`
writes over those rows.

The returned logits are a fresh tensor (a graph's output buffer is copied out), so they stay
valid after later steps.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from kernels.folded_norm import NORM_STATS
from ninfer.artifact.format import Artifact
from ninfer.ir.plan import Plan
from ninfer.runtime.executors.base import PlanExecutorBase
from ninfer.runtime.executors.cpu.weights import TORCH_DTYPES
from ninfer.runtime.executors.cuda.chain import ChainGraph, Link, run_chain
from ninfer.runtime.executors.cuda.graphs import captured, extra_buffers, scratch_layouts
from ninfer.runtime.executors.cuda.kv_cache import CudaKVCache, CudaStateSlots, auto_pages
from ninfer.runtime.executors.cuda.ops import CUDA_KERNELS, DeviceStep
from ninfer.runtime.executors.cuda.step_layout import (
    StepLayout,
    StepRecord,
    fill_step,
    verify_rows,
)
from ninfer.runtime.executors.cuda.weights import load_device_weights, weight_nbytes
from ninfer.runtime.executors.kernel_registry import KernelRegistry
from ninfer.runtime.executors.vision.encoder import MediaEncoder
from ninfer.runtime.executors.vision.ops import VisionContext
from ninfer.runtime.step import SeqChunk, StepBatch


@dataclass
class _DecodeGraph:
    batch: int
    graph: Any  # torch.cuda.CUDAGraph
    host: torch.Tensor  # pinned int32 [size]
    device: torch.Tensor  # int32 [size], the graph's input buffer
    copied: Any  # torch.cuda.Event: the last host -> device copy finished
    logits: torch.Tensor  # [batch, vocab] output buffer
    hidden: dict[str, torch.Tensor]  # captured hidden states (plan capture), [batch, hidden]
    extra: dict[str, torch.Tensor]  # the plan's extra step inputs (an MTP head's hidden)
    # the block tables `host` holds per row (step_layout.fill_step: rewritten where changed)
    tables: list[tuple[int, ...]] = field(default_factory=list)


_STEP_INPUTS = ("tokens", "positions", "logit_rows", "media_embeds", "media_rows")


class CudaExecutor(PlanExecutorBase):
    def __init__(
        self,
        plan: Plan,
        artifact: Artifact | Any,
        device: str | torch.device = "cuda",
        *,
        collect_timings: bool = False,
        kernels: KernelRegistry | None = None,
    ):
        self.plan = plan
        self._resolve(kernels or CUDA_KERNELS)  # every call by the kernel the plan names
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.dtype = TORCH_DTYPES[plan.dtype]
        self.weights = load_device_weights(plan, artifact, self.device)
        self.weight_bytes = sum(weight_nbytes(w) for w in self.weights.values())
        self.is_hybrid = bool(plan.state.layers)
        self.num_state_slots = plan.state.slots if self.is_hybrid else 0
        self.page_size = plan.kv.page_size
        num_pages = plan.kv.num_pages
        if plan.options.kv_capacity == "auto" and self.device.type == "cuda":
            num_pages = auto_pages(plan, self.device)
        self.kv = CudaKVCache(plan.kv, num_pages, self.device) if plan.kv.layers else None
        self.num_pages = num_pages
        self.state = (
            CudaStateSlots(plan.caches, self.num_state_slots, self.dtype, self.device)
            if self.is_hybrid
            else None
        )
        self.max_pages = -(-plan.options.max_context // self.page_size)
        self.max_rows = plan.options.max_concurrency  # verify rows of an eager decode step
        self.graph_buckets = set(plan.cuda_graph_buckets) if self.device.type == "cuda" else set()
        if not plan.options.cuda_graphs:
            self.graph_buckets = set()
        self._graphs: dict[int, _DecodeGraph] = {}
        self._chains: dict[tuple[int, int], ChainGraph] = {}  # (rows, steps): chain.py
        self._pool = torch.cuda.graph_pool_handle() if self.graph_buckets else None
        # the stream every step runs on, for event records on the hot path (current_stream()
        # costs more Python than the record itself)
        self._stream = torch.cuda.current_stream(self.device) if self.graph_buckets else None
        self._inv_freq: dict[str, torch.Tensor] = {}
        slots = 1 + max((int(c.attrs.get("stats_slot", -1)) for c in plan.calls), default=-1)
        self._norm_stats = (
            torch.zeros(slots, NORM_STATS, dtype=torch.float32, device=self.device)
            if slots
            else None
        )
        self._last_use = self._liveness()
        # --vision: the plan's vision stage per image / video (eager, outside CUDA Graphs) and
        # 3-axis positions [3, T] for the text rotary (torch.rotary_mrope)
        self.media = MediaEncoder.for_plan(plan, self._vision_stage, self.dtype, self.device)
        self._axes = 3 if self.merges_media else 1  # an MTP head's media: use_media
        self.collect_timings = collect_timings
        self.records: list[StepRecord] = []
        self.last_step_seconds = 0.0
        self.tokens_computed = 0  # positions run since construction (as the reference executor)
        # hidden states the plan captures (CompileOptions.capture), as the reference executor:
        # after each `run`, [T, hidden] per name, one row per token of the step in chunk order
        # (a verify step's rows keep that order); fresh tensors, valid after later steps
        self._capture_names: dict[str, str] = dict(plan.model.get("capture") or {})
        self.hidden: dict[str, torch.Tensor] = {}
        # inputs of a stage's plan beyond tokens, positions and rows (an MTP head's `hidden`):
        # name -> row width; graph buckets hold a buffer of each
        vision = {n for i in plan.vision_calls for n in plan.calls[i].inputs}  # per item
        self._extra = {
            n: int(plan.model["hidden"])
            for n in plan.inputs
            if n not in _STEP_INPUTS and n not in vision
        }
        self._prefill_events: dict[int, tuple[Any, Any]] = {}  # step index -> CUDA events

    def step_gpu_seconds(self, step_index: int) -> float | None:
        """Device time of prefill-class step `step_index` (its results were read, so its
        events completed); None for a decode step or one already asked for. Forgets older
        steps' events."""
        events = self._prefill_events.pop(step_index, None)
        for old in [i for i in self._prefill_events if i < step_index]:
            del self._prefill_events[old]
        if events is None:
            return None
        start, end = events
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    # -- sizes -------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return int(self.plan.model["vocab"])

    @property
    def kv_bytes_per_token(self) -> int:
        return self.plan.kv.bytes_per_token

    # -- step --------------------------------------------------------------------------------
    @torch.inference_mode()
    def run(
        self,
        batch: StepBatch,
        all_logits: bool = False,
        fed: torch.Tensor | None = None,
        inputs: dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Run one step; float32 logits [rows, vocab] (see the module docstring). `fed`: the
        previous step's sampled ids on the device, for a batch with `fed_rows`. `inputs`: step
        inputs a stage's plan has beyond tokens and positions (an MTP head's `hidden` [T,
        hidden], rows in chunk order); a decode step copies them into its graph's buffers."""
        t0 = time.perf_counter()
        for cp in batch.state_copies:
            self.copy_state(cp.src_slot, cp.dst_slot)
        chunks = batch.chunks
        for c in chunks:
            if len(c.token_ids) < 1:
                raise ValueError(f"sequence {c.seq_id}: empty chunk")
            if self.is_hybrid:
                self._check_slot(c.state_slot)
            if c.spill_slots:  # a hybrid verify chunk: the state after position t -> slot t
                for slot in c.spill_slots:
                    self._check_slot(slot)
                if len(c.spill_slots) != len(c.token_ids):
                    raise ValueError(
                        f"sequence {c.seq_id}: {len(c.token_ids)} tokens but"
                        f" {len(c.spill_slots)} spill slots"
                    )
        if not all_logits and not self.is_hybrid and any(c.num_logits > 1 for c in chunks):
            rows = verify_rows(chunks, max(self.graph_buckets, default=self.max_rows))
            if rows is not None:
                chunks = rows
                batch = dataclasses.replace(batch, chunks=rows)
        if self.state is not None:
            self.state.reset([c.state_slot for c in chunks if c.start_pos == 0])  # type: ignore[misc]
        decode = all(len(c.token_ids) == 1 and c.want_logits for c in chunks) and not all_logits
        n = len(chunks)
        use_graph = (
            decode
            and n in self.graph_buckets
            and all(len(c.block_table) <= self.max_pages for c in chunks)
            and not any(c.media for c in chunks)  # a 1-token chunk on a placeholder: eager
            and not any(c.spill_slots for c in chunks)  # graphs write no round slots
        )
        timing = self.collect_timings and self.device.type == "cuda"
        if use_graph:
            g = self._graphs.get(n) or self._capture(n)
            for name, value in self._extra_inputs(inputs, n).items():
                g.extra[name].copy_(value, non_blocking=True)
            start, end, host_s = self._replay(g, batch, fed, t0, timing)
            logits = g.logits.clone()
            self.hidden = {name: t.clone() for name, t in g.hidden.items()}
        else:
            # a prefill-class step is timed on the device always (step_gpu_seconds)
            timed = timing or (not decode and self.device.type == "cuda")
            start = torch.cuda.Event(enable_timing=True) if timed else None
            end = torch.cuda.Event(enable_timing=True) if timed else None
            if start is not None:
                start.record()
            logits = self._eager(batch, decode, all_logits, fed, inputs)
            if end is not None:
                end.record()
                if not decode:
                    self._prefill_events[batch.step_index] = (start, end)
            host_s = time.perf_counter() - t0
        if self.collect_timings:
            self.records.append(
                StepRecord(decode, use_graph, n, batch.num_tokens, host_s, start, end, t0)
            )
        self.last_step_seconds = time.perf_counter() - t0
        self.tokens_computed += batch.num_tokens
        return logits

    def _fill(
        self,
        buf: np.ndarray,
        lay: StepLayout,
        chunks: tuple[SeqChunk, ...],
        rows: list[int],
        written: list[tuple[int, ...]] | None = None,
    ) -> None:
        """Write a step's metadata into `buf` (int32, laid out by `lay`; step_layout.py;
        `written`: the tables a kept buffer's rows hold)."""
        scratch = self.kv.scratch_page if self.kv is not None else 0
        fill_step(buf, lay, chunks, rows, self.page_size, scratch, written)

    def _device_step(
        self, dev: torch.Tensor, lay: StepLayout, decode: bool, max_q_len: int
    ) -> tuple[DeviceStep, dict]:
        positions = lay.view(dev, "positions")
        step = DeviceStep(
            decode=decode,
            positions=positions if lay.axes == 1 else positions.view(lay.axes, lay.T),
            slot_mapping=lay.view(dev, "slots"),
            block_tables=lay.view(dev, "tables").view(lay.N, lay.W),
            seq_lens=lay.view(dev, "seq_lens"),
            cu_seqlens=lay.view(dev, "cu"),
            state_slots=lay.view(dev, "state"),
            max_q_len=max_q_len,
            kv=self.kv,
            state=self.state,
            inv_freq=self._inv_freq,
            norm_stats=self._norm_stats,
            spill_slots=lay.view(dev, "spill") if lay.spill else None,
        )
        inputs = {
            "tokens": lay.view(dev, "tokens"),
            "positions": step.positions,
            "logit_rows": lay.view(dev, "rows"),
        }
        if self.merges_media:  # no placeholder rows (a decode step); _eager fills a prefill's
            hidden = int(self.plan.model["hidden"])
            inputs["media_embeds"] = torch.empty(0, hidden, dtype=self.dtype, device=self.device)
            inputs["media_rows"] = torch.empty(0, dtype=torch.int32, device=self.device)
        return step, inputs

    def _forward(self, step: DeviceStep, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The step's logits; the captured hidden states go to `self.hidden`."""
        if step.norm_stats is not None:
            step.norm_stats.zero_()  # the fused RMSNorms' sums of squares (fuse_norm_linear)
        env = self._interpret(step, {**self.weights, **inputs}, step.decode)
        self.hidden = {name: env[out] for name, out in self._capture_names.items()}
        return env[self.plan.outputs[0]]

    def _eager(
        self,
        batch: StepBatch,
        decode: bool,
        all_logits: bool,
        fed: torch.Tensor | None,
        extra: dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        chunks = batch.chunks
        rows: list[int] = []
        t = 0
        for c in chunks:
            n = len(c.token_ids)
            if all_logits:
                rows.extend(range(t, t + n))
            elif c.want_logits:  # the last num_logits positions (1, or k + 1 to verify)
                rows.extend(range(t + n - min(c.num_logits, n), t + n))
            t += n
        width = max(-(-(c.start_pos + len(c.token_ids)) // self.page_size) for c in chunks)
        spill = any(c.spill_slots for c in chunks)
        lay = StepLayout(t, len(chunks), len(rows), width, self._axes, spill)
        host = np.zeros(lay.size, dtype=np.int32)
        self._fill(host, lay, chunks, rows)
        dev = torch.from_numpy(host).to(self.device)
        self._feed(lay.view(dev, "tokens"), batch, fed)
        step, inputs = self._device_step(dev, lay, decode, max(len(c.token_ids) for c in chunks))
        if self.merges_media and any(c.media for c in chunks):
            hidden = int(self.plan.model["hidden"])
            if self.media is None:  # an MTP head given no source: refused, never dropped
                self._no_media(batch, hidden)
            begins, b = [], 0  # (first step row, chunk): the vision stage runs per item, here
            for c in chunks:
                begins.append((b, c))
                b += len(c.token_ids)
            inputs["media_embeds"], inputs["media_rows"] = self.media.step_inputs(begins, hidden)
        inputs.update(self._extra_inputs(extra, t))
        return self._forward(step, inputs)

    def _extra_inputs(self, inputs: dict[str, torch.Tensor] | None, rows: int) -> dict:
        """`inputs` checked against the plan's extra inputs (every one given, `rows` rows each),
        on the device in the compute dtype."""
        given = dict(inputs or {})
        if set(given) != set(self._extra):
            raise ValueError(
                f"step inputs {sorted(given)}: this plan's extra inputs are {sorted(self._extra)}"
            )
        for name, value in given.items():
            if value.shape[0] != rows:
                raise ValueError(f"step input {name!r}: {value.shape[0]} rows for {rows} tokens")
            given[name] = value.to(self.device, self.dtype, non_blocking=True)
        return given

    def _vision_stage(self, ctx: VisionContext, inputs: dict[str, Any]) -> dict[str, Any]:
        """Run the plan's vision calls once over one item's inputs (MediaEncoder's runner):
        eager, on the current stream, before the step that reads the embeddings."""
        return self._interpret(ctx, {**self.weights, **inputs}, False, self.plan.vision_calls)

    # -- CUDA Graphs -------------------------------------------------------------------------
    def _capture(self, batch: int) -> _DecodeGraph:
        """Capture the decode step of `batch` rows (warm-up run first, on scratch KV/state)."""
        lay, host = scratch_layouts(self, batch)
        dev = host.to(self.device)
        extra = extra_buffers(self, batch)

        def body() -> torch.Tensor:
            step, inputs = self._device_step(dev, lay, True, 1)
            return self._forward(step, {**inputs, **extra})

        graph, logits = captured(self, body)
        g = _DecodeGraph(batch, graph, host, dev, torch.cuda.Event(), logits, self.hidden, extra)
        g.copied.record()
        self._graphs[batch] = g
        return g

    def drop_graphs(self) -> None:
        """Forget every captured decode graph (each is captured again on its next use), in a
        fresh memory pool: torch refuses a capture into a pool whose graphs have all been freed
        while its memory is still held (an internal assert at capture_begin)."""
        self._graphs.clear()
        self._chains.clear()
        if self.graph_buckets:
            self._pool = torch.cuda.graph_pool_handle()

    def capture_all(self) -> int:
        """Capture every bucket now (the engine otherwise captures each on first use);
        returns how many graphs exist."""
        with torch.inference_mode():
            for b in sorted(self.graph_buckets, reverse=True):
                if b not in self._graphs:
                    self._capture(b)
        return len(self._graphs)

    @torch.inference_mode()
    def run_chain(
        self, first: StepBatch, steps: int, inputs: dict[str, torch.Tensor], link: Link,
        fed: torch.Tensor | None = None,
    ) -> torch.Tensor | None:  # fmt: skip
        """A drafter's chain of `steps` decode steps from `first` as one CUDA Graph (chain.py):
        the picks [steps, rows], or None when the chain cannot run as one (the caller then runs
        each step)."""
        return run_chain(self, first, steps, inputs, link, fed)

    def _replay(
        self, g: _DecodeGraph, batch: StepBatch, fed: torch.Tensor | None, t0: float, timing: bool
    ):
        lay = StepLayout(g.batch, g.batch, g.batch, self.max_pages, self._axes)
        g.copied.synchronize()  # the previous copy has read the pinned buffer
        h = g.host.numpy()
        self._fill(h, lay, batch.chunks, list(range(g.batch)), g.tables)
        start = end = None
        if timing:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        g.device.copy_(g.host, non_blocking=True)
        g.copied.record(self._stream)
        self._feed(lay.view(g.device, "tokens"), batch, fed)
        g.graph.replay()
        if end is not None:
            end.record()
        return start, end, time.perf_counter() - t0


def make_executor(
    plan: Plan, artifact: Artifact | Any, device: str | torch.device | None = None, **kwargs: Any
):
    """The executor for `plan` on `device` (default: the plan's device): CudaExecutor on a
    CUDA device, the reference Executor otherwise."""
    dev = torch.device(device if device is not None else plan.device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            from ninfer.errors import ConfigError

            raise ConfigError(
                "--device cuda: no CUDA device is available (torch.cuda.is_available() is False)"
            )
        return CudaExecutor(plan, artifact, dev, **kwargs)
    from ninfer.runtime.executors.cpu.executor import Executor

    return Executor(plan, artifact, dev, kernels=kwargs.get("kernels"))
