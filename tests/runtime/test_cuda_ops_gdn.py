"""The CUDA executor's Gated DeltaNet ops compute the reference ops (ninfer.runtime.executors.cpu.ops).

One DeltaNet layer's non-GEMM chain, as the plan runs it (split views of the fused in_proj
output -> causal_conv1d -> split -> gdn_gates -> gated_delta_rule -> gated_rmsnorm), through
the CUDA kernels the plan names (`cuda_ops.CUDA_KERNELS`) on a `DeviceStep` with a `CudaStateSlots` pool, and through `ops_torch.OPS`
on a `StepContext` with the reference `StateSlots`: a prefill of two sequences in scattered
slots, then a decode step; and a speculative verify step whose chunk spills the state after
each of its positions into its round slots (one of them the sequence's own slot) beside a chunk
that does not. On CPU the Triton kernels run under the interpreter.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before kernels/ is imported

import pytest

from ninfer.passes.assign_kernels import CUDA_KERNELS as NAMES
from ninfer.runtime.executors.cpu import ops as ops_torch
from ninfer.runtime.executors.cpu.kv_cache import StateSlots
from ninfer.runtime.executors.cpu.ops import ChunkView, StepContext
from ninfer.runtime.executors.cuda import ops as cuda_ops
from ninfer.runtime.executors.cuda.kv_cache import CudaStateSlots
from ninfer.runtime.executors.cuda.ops import CUDA_KERNELS, DeviceStep

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
HK, HV, DK, DV, KS = 2, 4, 16, 8, 4  # Hv = 2 Hk: value head h reads key head h // 2
CONV = 2 * HK * DK + HV * DV  # conv channels: q ‖ k ‖ v
SLOTS = (3, 0)  # the two sequences' state slots, out of order; slots 1, 2 (and scratch 4) idle
NUM_SLOTS = 4
CACHES = {
    "state.L0": {
        "kind": "state", "layer": 0, "conv_dim": CONV, "kernel_size": KS,
        "v_heads": HV, "k_dim": DK, "v_dim": DV,
    }
}  # fmt: skip
ATTRS = {
    "split_in": {"sizes": [CONV, HV * DV, HV, HV]},
    "conv": {"cache": "state.L0", "kernel_size": KS, "layer": 0},
    "split_qkv": {"sizes": [HK * DK, HK * DK, HV * DV]},
    "gdr": {
        "cache": "state.L0",
        "layer": 0,
        "k_heads": HK,
        "v_heads": HV,
        "k_dim": DK,
        "v_dim": DV,
    },
    "norm": {"eps": 1e-6, "head_dim": DV},
}


CUDA_OPS = {  # op kind -> the implementation of the kernel a cuda plan names for it
    op: CUDA_KERNELS.lookup("view.split" if op == "split" else NAMES[op], op)
    for op in ("split", "causal_conv1d", "gdn_gates", "gated_delta_rule", "gated_rmsnorm")
}


def _layer(ops: dict, step, proj: torch.Tensor, w: dict[str, torch.Tensor]) -> dict:
    """Run the layer's chain on `proj` [T, CONV + HV*DV + 2 HV]; every intermediate by name."""
    out: dict[str, torch.Tensor] = {}
    qkv_raw, z, b, a = ops["split"](step, ATTRS["split_in"], proj)
    out["conv"] = ops["causal_conv1d"](step, ATTRS["conv"], qkv_raw, w["conv"])
    q, k, v = ops["split"](step, ATTRS["split_qkv"], out["conv"])
    out["g"], out["beta"] = ops["gdn_gates"](step, {}, a, b, w["A_log"], w["dt_bias"])
    out["delta"] = ops["gated_delta_rule"](step, ATTRS["gdr"], q, k, v, out["g"], out["beta"])
    out["normed"] = ops["gated_rmsnorm"](step, ATTRS["norm"], out["delta"], z, w["norm"])
    return out


def _device_step(
    lens: list[int],
    starts: list[int],
    state: CudaStateSlots,
    slots: tuple[int, ...] = SLOTS,
    spills: tuple[tuple[int, ...], ...] = (),
) -> DeviceStep:
    """The step's metadata; `spills`: per chunk its spill slots (() for a chunk that does not
    spill), or () for a step without spill slots."""
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    i32 = {"dtype": torch.int32, "device": DEVICE}
    positions = torch.cat([torch.arange(s, s + n) for s, n in zip(starts, lens)])
    return DeviceStep(
        decode=all(n == 1 for n in lens),
        positions=positions.to(**i32),
        slot_mapping=positions.to(**i32),  # unused: no attention layer here
        block_tables=torch.zeros(len(lens), 1, **i32),
        seq_lens=torch.tensor([s + n for s, n in zip(starts, lens)], **i32),
        cu_seqlens=torch.tensor(cu, **i32),
        state_slots=torch.tensor(slots, dtype=torch.int64, device=DEVICE),
        max_q_len=max(lens),
        kv=None,
        state=state,
        spill_slots=(
            torch.tensor([t for sp, n in zip(spills, lens) for t in (sp or [-1] * n)], **i32)
            if spills
            else None
        ),
    )


def _context(
    lens: list[int],
    starts: list[int],
    state: StateSlots,
    slots: tuple[int, ...] = SLOTS,
    spills: tuple[tuple[int, ...], ...] = (),
) -> StepContext:
    chunks, begin = [], 0
    for i, (n, s, slot) in enumerate(zip(lens, starts, slots)):
        chunks.append(ChunkView(begin, n, s, (0,), slot, spills[i] if spills else ()))
        begin += n
    return StepContext(chunks, None, state, {})  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gdn_layer_ops_match_reference(dtype) -> None:
    assert all(CUDA_OPS[op] is not getattr(ops_torch, op) for op in ("gdn_gates", "gated_rmsnorm"))
    gen = torch.Generator().manual_seed(0)
    w = {
        "conv": torch.randn(CONV, 1, KS, generator=gen),
        "A_log": torch.randn(HV, generator=gen),
        "dt_bias": torch.randn(HV, generator=gen),
        "norm": 1 + 0.2 * torch.randn(DV, generator=gen),
    }
    w = {k: t.to(DEVICE, dtype) for k, t in w.items()}
    dev_state = CudaStateSlots(CACHES, NUM_SLOTS, dtype, torch.device(DEVICE))
    ref_state = StateSlots(CACHES, NUM_SLOTS + 1, dtype, torch.device(DEVICE))
    # the pools start from random states (as after earlier steps), equal in both
    for t_dev, t_ref in zip(dev_state.tensors(), ref_state.tensors()):
        t_dev.copy_(torch.randn(t_dev.shape, generator=gen).to(t_dev.dtype))
        t_ref.copy_(t_dev)
    idle = [t[[1, 2, NUM_SLOTS]].clone() for t in dev_state.tensors()]
    tol = {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 5e-2, "atol": 5e-2}

    width = CONV + HV * DV + 2 * HV
    lens_starts = [([7, 3], [0, 0]), ([1, 1], [7, 3]), ([1, 1], [8, 4])]  # prefill, 2 decodes
    for lens, starts in lens_starts:
        proj = torch.randn(sum(lens), width, generator=gen).to(DEVICE, dtype)
        got = _layer(CUDA_OPS, _device_step(lens, starts, dev_state), proj, w)
        want = _layer(ops_torch.OPS, _context(lens, starts, ref_state), proj, w)
        for name in want:
            assert got[name].dtype == want[name].dtype, name
            torch.testing.assert_close(got[name].float(), want[name].float(), **tol, msg=name)
        for slot in SLOTS:
            torch.testing.assert_close(
                dev_state.conv[0][slot].float(), ref_state.conv[0][slot].float(), **tol
            )
            torch.testing.assert_close(dev_state.ssm[0][slot], ref_state.ssm[0][slot], **tol)
    for before, t in zip(idle, dev_state.tensors()):
        assert torch.equal(t[[1, 2, NUM_SLOTS]], before)  # in place, and only the step's slots


def _random_pools(num_slots: int, dtype: torch.dtype, gen: torch.Generator):
    """A CUDA-executor pool and a reference pool of `num_slots` slots, equal random states."""
    dev_state = CudaStateSlots(CACHES, num_slots, dtype, torch.device(DEVICE))
    ref_state = StateSlots(CACHES, num_slots + 1, dtype, torch.device(DEVICE))
    for t_dev, t_ref in zip(dev_state.tensors(), ref_state.tensors()):
        t_dev.copy_(torch.randn(t_dev.shape, generator=gen).to(t_dev.dtype))
        t_ref.copy_(t_dev)
    return dev_state, ref_state


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_verify_chunk_spills_each_position_state(dtype) -> None:
    """A verify chunk of 4 tokens in slot 3 spilling into round slots (5, 1, 3, 6) (its own
    slot among them, as after a round that accepted 2 drafts), beside a 2-token chunk in slot 0
    that does not spill: the outputs and every slot of the pool equal the reference ops';
    slots 2, 4, 7 and the scratch slot stay untouched. Then a decode step from round slot 1
    (the state after the verify chunk's position 1, as the commit selects it) agrees too."""
    gen = torch.Generator().manual_seed(2)
    w = {
        "conv": torch.randn(CONV, 1, KS, generator=gen),
        "A_log": torch.randn(HV, generator=gen),
        "dt_bias": torch.randn(HV, generator=gen),
        "norm": 1 + 0.2 * torch.randn(DV, generator=gen),
    }
    w = {k: t.to(DEVICE, dtype) for k, t in w.items()}
    num_slots = 8
    dev_state, ref_state = _random_pools(num_slots, dtype, gen)
    idle = [2, 4, 7, num_slots]
    before = [t[idle].clone() for t in dev_state.tensors()]
    tol = {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 5e-2, "atol": 5e-2}
    width = CONV + HV * DV + 2 * HV
    steps = [  # (lens, starts, slots, spills)
        ([4, 2], [9, 5], (3, 0), ((5, 1, 3, 6), ())),
        ([1, 1], [11, 7], (1, 0), ()),  # round slot 1 continues; no spill slots at all
    ]
    for lens, starts, slots, spills in steps:
        proj = torch.randn(sum(lens), width, generator=gen).to(DEVICE, dtype)
        got = _layer(CUDA_OPS, _device_step(lens, starts, dev_state, slots, spills), proj, w)
        want = _layer(ops_torch.OPS, _context(lens, starts, ref_state, slots, spills), proj, w)
        for name in want:
            torch.testing.assert_close(got[name].float(), want[name].float(), **tol, msg=name)
        for slot in range(num_slots):
            torch.testing.assert_close(
                dev_state.conv[0][slot].float(), ref_state.conv[0][slot].float(), **tol,
                msg=f"conv slot {slot}",
            )  # fmt: skip
            torch.testing.assert_close(
                dev_state.ssm[0][slot], ref_state.ssm[0][slot], **tol, msg=f"ssm slot {slot}"
            )
    for old, t in zip(before, dev_state.tensors()):
        assert torch.equal(t[idle], old)


def test_long_prefill_matches_reference(monkeypatch) -> None:
    """A chunk of GDN_CHUNKED_MIN_TOKENS or more: fla's chunked rule on gathered states when it
    is opted in (NINFER_GDN_PREFILL=fla), else the recurrent kernel; either computes the
    reference."""
    monkeypatch.setattr(cuda_ops, "GDN_CHUNKED_MIN_TOKENS", 4)  # a short "long" prefill
    lens = [6, 1]
    T = sum(lens)
    gen = torch.Generator().manual_seed(1)
    state = CudaStateSlots(CACHES, NUM_SLOTS, torch.float32, torch.device(DEVICE))
    ref = StateSlots(CACHES, NUM_SLOTS + 1, torch.float32, torch.device(DEVICE))
    q, k = (torch.randn(T, HK * DK, generator=gen).to(DEVICE) for _ in range(2))
    v = torch.randn(T, HV * DV, generator=gen).to(DEVICE)
    g = -torch.rand(T, HV, generator=gen).to(DEVICE)
    beta = torch.rand(T, HV, generator=gen).to(DEVICE)
    args = (q, k, v, g, beta)
    got = CUDA_OPS["gated_delta_rule"](_device_step(lens, [0, 0], state), ATTRS["gdr"], *args)
    want = ops_torch.gated_delta_rule(_context(lens, [0, 0], ref), ATTRS["gdr"], *args)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(
        state.ssm[0][:NUM_SLOTS], ref.ssm[0][:NUM_SLOTS], rtol=1e-4, atol=1e-4
    )
