"""Programmatic dependent launch (kernels/launch.py): which launches use it, and what the
kernels do before they wait for the kernel they depend on."""

from __future__ import annotations

import json

import pytest
import torch

from kernels import launch
from kernels.compile_check import run_fresh

# Compiled for sm_90 in a fresh process (outside the interpreter, no GPU needed): per kernel,
# the global loads and stores the PTX issues before its first griddepcontrol.wait, and whether
# launch_dependents follows the wait.
_COMPILE_CHECK = """
import json, re
from kernels.compile_check import compile_for_cuda
from kernels.fp8_gemv import Fp8GemvConfig, compile_fp8_gemv
from kernels.gemv import _dense_gemv_kernel
from kernels.nvfp4_gemv import _nvfp4_gemv_kernel
from kernels.paged_decode import _merge_kernel
from kernels.rmsnorm import _rmsnorm_kernel

def before_wait(ptx):
    lines = [l.strip() for l in ptx.splitlines()]
    lines = [l for l in lines if re.match(r"(?:@%p\\d+ )?(?:ld|st|red|atom)\\.global|griddep", l)]
    waits = [i for i, l in enumerate(lines) if l.startswith("griddepcontrol.wait")]
    if not waits:
        return None
    head = lines[: waits[0]]
    return {
        "loads": sum(bool(re.search(r"\\bld\\.global", l)) for l in head),
        "loads_16b": sum(bool(re.search(r"\\bld\\.global(?:\\.[\\w:]+)*\\.v4", l)) for l in head),
        "stores": sum(bool(re.search(r"\\b(?:st|red|atom)\\.global", l)) for l in head),
        "evict_first": sum("evict_first" in l for l in head if re.search(r"\\bld\\.global", l)),
        "then_launch": lines[waits[0] + 1].startswith("griddepcontrol.launch_dependents"),
    }

def dims(sig):
    return [a for a in sig if a.endswith("_ptr") or a.startswith("stride") or a == "K"]

out = {}
sig = {"x_ptr": "*bf16", "w_ptr": "*bf16", "y_ptr": "*bf16"}
sig |= {a: "i32" for a in ("M", "N", "K", "stride_xm", "stride_wn", "stride_ym")}
const = {"GLU": False, "BM": 1, "BN": 1, "BK": 2048, "UNROLL": 2, "EVEN": True, "PDL": True}
k = compile_for_cuda(_dense_gemv_kernel, sig, const, divisible=dims(sig), num_warps=8)
out["dense"] = before_wait(k.asm["ptx"])
k = compile_fp8_gemv(Fp8GemvConfig(4, 4, 1), glu=True, bm=1, even=True)
out["fp8"] = before_wait(k.asm["ptx"])
k = compile_fp8_gemv(Fp8GemvConfig(4, 4, 1), glu=True, bm=1, even=True, pdl=False)
out["fp8_off"] = before_wait(k.asm["ptx"])
sig = {"x_ptr": "*i32", "w_ptr": "*i32", "s_ptr": "*u8", "g_ptr": "*fp32", "y_ptr": "*bf16"}
sig |= {a: "i32" for a in ("M", "N", "K")} | {"gscale": "fp32"}
sig |= {a: "i32" for a in ("stride_xm", "stride_ym")}
const = {"HAS_G": False, "BM": 1, "BN": 4, "R": 128, "UNROLL": 2, "X32": True, "MMA": False,
         "EVEN": True, "HW": True, "SWIGLU": False, "PDL": True, "S16": False,
         "stride_wn": 512, "stride_sn": 256}
k = compile_for_cuda(_nvfp4_gemv_kernel, sig, const, divisible=dims(sig), num_warps=4)
out["nvfp4"] = before_wait(k.asm["ptx"])
const |= {"MMA": True, "S16": True}
k = compile_for_cuda(_nvfp4_gemv_kernel, sig, const, divisible=dims(sig), num_warps=4)
out["nvfp4_mma"] = before_wait(k.asm["ptx"])
sig = {"x_ptr": "*bf16", "res_ptr": "*bf16", "w_ptr": "*bf16", "y_ptr": "*bf16",
       "res_out_ptr": "*bf16", "H": "i32", "stride_x": "i32", "stride_r": "i32",
       "stride_y": "i32", "stride_ro": "i32", "eps": "fp32"}
const = {"HAS_RES": True, "ZERO_CENTERED": False, "BLOCK": 4096, "PDL": True}
k = compile_for_cuda(_rmsnorm_kernel, sig, const, divisible=dims(sig), num_warps=8)
out["rmsnorm"] = before_wait(k.asm["ptx"])
sig = {"po_ptr": "*fp32", "plse_ptr": "*fp32", "out_ptr": "*bf16", "Hq": "i32",
       "stride_ob": "i32", "stride_oh": "i32"}
const = {"D": 128, "BLOCK_D": 128, "NUM_SPLITS": 8, "BLOCK_S": 8, "PDL": True}
k = compile_for_cuda(_merge_kernel, sig, const, divisible=dims(sig), num_warps=4)
out["merge"] = before_wait(k.asm["ptx"])
print(json.dumps(out))
"""


def test_kernels_issue_only_weight_loads_before_the_wait() -> None:
    """The GEMVs issue their first weight chunks (16-byte loads, nothing else) before
    griddepcontrol.wait, the RMSNorm its gain, the attention merge nothing; no kernel writes
    before it, every one lets the next kernel launch right after it, and a kernel compiled
    with PDL off has no wait at all."""
    pytest.importorskip("triton.backends.nvidia")
    got = json.loads(run_fresh(_COMPILE_CHECK))
    assert got.pop("fp8_off") is None
    # (loads, of them 16 bytes wide): dense 1 row x 2 chunks, fp8 4 rows x 1 chunk, nvfp4 4 rows
    # x 2 chunks + a block-scale pair each (two bytes; the tensor-core variant: one 16-bit
    # load); rmsnorm the gain (4096 bf16 over 256 threads, masked 2-byte loads); the attention
    # merge nothing
    before = {"dense": (2, 2), "fp8": (4, 4), "nvfp4": (16, 8), "nvfp4_mma": (16, 8)}
    before |= {"rmsnorm": (16, 0), "merge": (0, 0)}
    for name, (loads, wide) in before.items():
        st = got[name]
        assert st["stores"] == 0 and st["then_launch"], (name, st)
        assert (st["loads"], st["loads_16b"]) == (loads, wide), (name, st)
        # weights (and nvfp4 block scales) stream through L2 evict-first (kernels/launch.py)
        weights = {"dense": 2, "fp8": 4, "nvfp4": 16, "nvfp4_mma": 16}.get(name, 0)
        assert st["evict_first"] == weights, (name, st)


def test_pdl_args_off_where_unsupported(monkeypatch) -> None:
    """No programmatic launch on the CPU or with NINFER_PDL=0; where it is on, PDL and
    launch_pdl come together (a kernel launched early always waits)."""
    assert launch.pdl_args(torch.device("cpu")) == {"PDL": False}
    if not torch.cuda.is_available():
        return
    dev = torch.device("cuda")
    launch._pdl_enabled.cache_clear()
    try:
        monkeypatch.setenv("NINFER_PDL", "0")
        assert launch.pdl_args(dev) == {"PDL": False}
        launch._pdl_enabled.cache_clear()
        monkeypatch.delenv("NINFER_PDL")
        args = launch.pdl_args(dev)
        hopper = torch.cuda.get_device_capability() >= (9, 0)
        assert args == ({"PDL": True, "launch_pdl": True} if hopper else {"PDL": False})
    finally:
        launch._pdl_enabled.cache_clear()
