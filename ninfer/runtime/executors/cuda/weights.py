"""Upload a plan's weights to the GPU once, in the form each kernel reads.

    weights of `triton.gemm_fp8` / `triton.gemm_nvfp4` calls   kept packed (QuantWeight)
    everything else                                            dense, in the compute dtype

A packed weight is one segment: fp8's per-row scales concatenate; nvfp4 sources each carry a
global scale, which stays a float when the fused sources share it and becomes a per-row fp32
tensor [N] otherwise (quant_linear takes either), so a fused GEMM is one launch. Layouts (plain, concat, stack, stack_concat) are those of
ninfer.runtime.executors.cpu.weights.

The source is an `ninfer.artifact.Artifact`, or any object with `info(name)` (format, shape) and
`device_parts(name, device) -> {part: tensor}` (the synthetic models of ninfer.bench.synthetic).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from kernels.fp8_mma import Fp8MmaConfig, fp8_mma, nvfp4_mma_config, usable_nvfp4
from kernels.nvfp4_mma import Nvfp4MmaWeight, prepare
from kernels.quant_gemm import dequantize_weight, quant_linear
from kernels.silu_mul import silu_mul
from ninfer.errors import ConfigError
from ninfer.ir.plan import BufferSpec, Plan
from ninfer.passes.plan_memory import NVFP4_COPIES, copy_bytes, copy_enabled
from ninfer.runtime.executors.cpu.weights import TORCH_DTYPES, take_shard

QUANT_GEMMS = {"triton.gemm_fp8": "fp8", "triton.gemm_nvfp4": "nvfp4"}


@dataclass
class QuantSegment:
    data: torch.Tensor  # fp8 [N, K] uint8 | nvfp4 [N, K/2] uint8
    scale: torch.Tensor  # fp8 [N] f32 | nvfp4 [N, K/16] e4m3 bytes
    global_scale: float | torch.Tensor  # nvfp4: float, or fp32 [N] per row; 1.0 for fp8
    # nvfp4 on sm_89+: the copy the tensor-core decode GEMV reads (kernels/nvfp4_mma.py)
    mma: Nvfp4MmaWeight | None = None


@dataclass
class QuantWeight:
    """A weight the quantised GEMM kernel dequantises in registers: y = x @ Wᵀ."""

    fmt: str  # fp8 | nvfp4
    segments: list[QuantSegment]

    @property
    def out_features(self) -> int:
        return sum(s.data.shape[0] for s in self.segments)

    def nbytes(self) -> int:
        """Device memory held, the repacked copies included."""
        return self.read_bytes() + sum(s.mma.nbytes() for s in self.segments if s.mma is not None)

    def read_bytes(self) -> int:
        """Bytes one product with this weight reads (one copy of it)."""
        return sum(
            s.data.numel()
            + s.scale.numel() * s.scale.element_size()
            + (s.global_scale.numel() * 4 if isinstance(s.global_scale, torch.Tensor) else 0)
            for s in self.segments
        )

    def mma_config(self, x: torch.Tensor, glu: bool = False) -> Fp8MmaConfig | None:
        """The tensor-core GEMV's launch shape for x against this nvfp4 weight's repacked copy
        (one row of bf16 x), or None: quant_linear's paths."""
        seg = self.segments[0]
        if self.fmt != "nvfp4" or len(self.segments) != 1 or seg.mma is None:
            return None
        if x.dim() != 2 or not usable_nvfp4(x, seg.mma):
            return None
        N, K = seg.mma.shape
        return nvfp4_mma_config(N, K, x.shape[0], glu)

    def linear(self, x: torch.Tensor, glu: bool = False, swiglu_out: bool = False) -> torch.Tensor:
        """x [M, K] (last dim contiguous) -> [M, N] in x.dtype; glu: x is [M, 2K] = gate | up
        and the input is silu(gate) * up (quant_linear folds it into the fp8 GEMV where it can);
        swiglu_out: the weight is [gate; up] and the result silu(gate) * up, [M, N/2] (in the
        fp8 GEMV's epilogue where quant_linear can). One row of x against an nvfp4 weight with
        a repacked copy: the tensor-core GEMV (kernels/fp8_mma.py)."""
        cfg = self.mma_config(x, glu)
        if cfg is not None:
            return fp8_mma(x, self.segments[0].mma, None, cfg, glu=glu, swiglu_out=swiglu_out)
        if swiglu_out and len(self.segments) == 1:
            s = self.segments[0]
            return quant_linear(
                x, s.data, s.scale, self.fmt, s.global_scale, glu=glu, swiglu_out=True
            )
        ys = [
            quant_linear(x, s.data, s.scale, self.fmt, s.global_scale, glu=glu)
            for s in self.segments
        ]
        y = ys[0] if len(ys) == 1 else torch.cat(ys, dim=-1)
        return silu_mul(y) if swiglu_out else y


def device_parts(
    source: Any, name: str, device: torch.device
) -> tuple[str, dict[str, torch.Tensor]]:
    """(storage format, {part: tensor on device}) of one stored tensor; formats the GPU path
    does not read natively (gguf blocks, f16) arrive as f32 through the reference dequantiser."""
    if hasattr(source, "device_parts"):
        return source.info(name).format, source.device_parts(name, device)
    info = source.info(name)
    fmt = info.format
    if fmt == "bf16":
        raw = np.ascontiguousarray(source.array(name)).view(np.int16)
        return fmt, {"data": torch.from_numpy(raw).view(torch.bfloat16).to(device)}
    if fmt in ("fp8", "nvfp4"):
        parts = {
            p: torch.from_numpy(np.ascontiguousarray(source.array(name, p))).to(device)
            for p in info.parts
        }
        return fmt, parts
    return "f32", {
        "data": torch.from_numpy(np.array(source.dense(name), dtype=np.float32)).to(device)
    }


def dense_from_parts(fmt: str, parts: dict[str, torch.Tensor]) -> torch.Tensor:
    """float32 value of a stored tensor whose parts are on the device."""
    if fmt in ("bf16", "f32", "f16"):
        return parts["data"].float()
    if fmt == "fp8":
        return dequantize_weight(parts["data"], parts["scale"], "fp8")
    if fmt == "nvfp4":
        return dequantize_weight(
            parts["data"], parts["scale"], "nvfp4", float(parts["global_scale"].reshape(-1)[0])
        )
    raise ValueError(f"unknown storage format {fmt!r}")


def _arrange(spec: BufferSpec, srcs: list[torch.Tensor]) -> torch.Tensor:
    if spec.layout == "plain":
        return srcs[0]
    if spec.layout == "concat":
        return torch.cat(srcs, dim=0)
    if spec.layout == "stack":
        return torch.stack(srcs)
    if spec.layout == "stack_concat":
        e = len(srcs) // 2
        return torch.stack([torch.cat([srcs[i], srcs[e + i]], dim=0) for i in range(e)])
    raise ValueError(f"weight {spec.name}: unknown layout {spec.layout!r}")


def _packed(fmt: str, parts: list[dict[str, torch.Tensor]], mma_copy: bool = True) -> QuantWeight:
    datas = [p["data"].contiguous() for p in parts]
    scales = [p["scale"].contiguous() for p in parts]
    data = datas[0] if len(datas) == 1 else torch.cat(datas)
    if fmt == "fp8":
        scale = torch.cat([s.float() for s in scales])
        return QuantWeight(fmt, [QuantSegment(data, scale, 1.0)])
    scale = scales[0] if len(scales) == 1 else torch.cat(scales)
    gss = [float(p["global_scale"].reshape(-1)[0]) for p in parts]
    gs: float | torch.Tensor = gss[0]
    if any(g != gss[0] for g in gss):
        gs = torch.cat(
            [
                torch.full((d.shape[0],), g, dtype=torch.float32, device=d.device)
                for d, g in zip(datas, gss)
            ]
        )
    mma = _mma_copy(data, scale, gs) if mma_copy else None
    return QuantWeight(fmt, [QuantSegment(data, scale, gs, mma)])


def _mma_copy(
    data: torch.Tensor, scale: torch.Tensor, gs: float | torch.Tensor
) -> Nvfp4MmaWeight | None:
    """The repacked copy of an nvfp4 weight for the tensor-core decode GEMV, on sm_89+ GPUs
    (K % 32 == 0); NINFER_NVFP4_MMA=0 leaves it out (0.5 bytes per value of device memory, and
    batch-1 decode then runs kernels/nvfp4_gemv.py), as does a plan that did not budget it."""
    if not copy_enabled() or not data.is_cuda or copy_bytes(data.shape[0], 2 * data.shape[1]) == 0:
        return None
    if torch.cuda.get_device_capability(data.device) < (8, 9):
        return None
    return prepare(data, scale, gs)


def load_device_weights(
    plan: Plan, source: Any, device: torch.device
) -> dict[str, torch.Tensor | QuantWeight]:
    """name -> device weight for every weight buffer of `plan` (see the module docstring)."""
    dtype = TORCH_DTYPES[plan.dtype]
    packed_fmt: dict[str, str] = {}
    for c in plan.calls:
        if c.kernel in QUANT_GEMMS:
            packed_fmt[c.inputs[1]] = QUANT_GEMMS[c.kernel]
    # the plan's memory ledger says whether the nvfp4 copies fit (ninfer/passes/plan_memory.py)
    copies = plan.ledger.has(NVFP4_COPIES)
    out: dict[str, torch.Tensor | QuantWeight] = {}
    for spec in plan.weights():
        loaded = [device_parts(source, s, device) for s in spec.sources]
        want = packed_fmt.get(spec.name)
        if want is not None and spec.shards:
            raise ConfigError(
                f"tensor parallelism: weight {spec.name} is stored {want}; a rank's part of "
                "fp8 / nvfp4 weights is not supported yet (convert with --weights bf16)"
            )
        if (
            want is not None
            and spec.layout in ("plain", "concat")
            and all(f == want for f, _ in loaded)
        ):
            out[spec.name] = _packed(want, [p for _, p in loaded], copies)
        else:
            shards = spec.shards or (None,) * len(loaded)
            srcs = [
                take_shard(dense_from_parts(f, p).to(dtype), shard, torch.cat)
                for (f, p), shard in zip(loaded, shards)
            ]
            out[spec.name] = _arrange(spec, srcs).contiguous()
        del loaded
    return out


def weight_nbytes(w: torch.Tensor | QuantWeight) -> int:
    """Device memory a weight holds."""
    return w.nbytes() if isinstance(w, QuantWeight) else w.numel() * w.element_size()


def weight_read_bytes(w: torch.Tensor | QuantWeight) -> int:
    """Bytes a product with the weight reads (a quantised weight's repacked copy is the same
    weight again: counted once)."""
    return w.read_bytes() if isinstance(w, QuantWeight) else w.numel() * w.element_size()
