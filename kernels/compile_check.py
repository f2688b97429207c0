"""Compile a Triton kernel for a CUDA target without a GPU, and read what its inner loop does.

A kernel's speed on the GPU hinges on code the interpreter never shows: the width of its loads
and whether the compiler moved a tensor between register layouts through shared memory. Both
are visible in the PTX that ``triton.compile`` produces on any machine (the NVIDIA backend and
its ptxas ship with triton):

    k = compile_for_cuda(fn, {"x_ptr": "*bf16", ...}, {"BN": 4, ...}, divisible=("x_ptr", ...),
                         num_warps=4)
    loop_stats(k.asm["ptx"])   # LoopStats(loads_16b=12, loads=12, shared=0, ...)
    resource_usage(k)          # {"REG": 96, "STACK": 0, ...} when cuobjdump is available

Used by tests/kernels/test_fp8_gemv.py and ``bench/fp8_gemv_bench.py --compile-only``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


def run_fresh(code: str, timeout: float = 300) -> str:
    """Run Python ``code`` in a fresh interpreter from the project root, outside Triton's CPU
    interpreter (tests set TRITON_INTERPRET=1 before the kernels are decorated), and return the
    last line it printed. Raises AssertionError with its stderr when it fails."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[1]
    run = subprocess.run(
        [sys.executable, "-c", code],
        env=env, cwd=root, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout.strip().splitlines()[-1]


def compile_for_cuda(
    fn: Any,
    signature: dict[str, str],
    constexprs: dict[str, Any],
    *,
    divisible: Iterable[str] = (),
    num_warps: int = 4,
    num_stages: int = 1,
    arch: int = 90,
) -> Any:
    """triton.compile of the @triton.jit ``fn`` for sm_<arch> (default Hopper): ``signature``
    maps every runtime argument to its type ("*bf16", "*u8", "i32", ...), ``constexprs`` the
    constexpr arguments to their values; the arguments in ``divisible`` are taken as multiples of
    16 (pointers: 16-byte aligned), as the launcher specialises them. Raises what the compiler
    raises (a kernel that does not compile for the target)."""
    sig = dict(signature) | {name: "constexpr" for name in constexprs}
    names = list(fn.arg_names)
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in divisible}
    src = ASTSource(fn=fn, signature=sig, constexprs=dict(constexprs), attrs=attrs)
    return triton.compile(
        src,
        target=GPUTarget("cuda", arch, 32),
        options={"num_warps": num_warps, "num_stages": num_stages},
    )


class LoopStats(NamedTuple):
    """PTX instructions inside the kernel's loops (a loop: a label and a backward branch to
    it): global loads (and those 16 bytes wide), shared-memory loads + stores, barriers, byte
    permutes (prmt) and warp shuffles."""

    loops: int
    loads_16b: int
    loads: int
    shared: int
    barriers: int
    prmt: int
    shuffles: int


def _loop_bodies(ptx: str) -> list[list[str]]:
    """The PTX lines of each loop, in program order."""
    lines = ptx.splitlines()
    labels = {}
    for i, line in enumerate(lines):
        m = re.match(r"^(\$L__BB\d+_\d+):", line.strip())
        if m:
            labels[m.group(1)] = i
    bodies = []
    for j, line in enumerate(lines):
        m = re.search(r"\bbra(?:\.uni)?\s+(\$L__BB\d+_\d+);", line)
        if m and labels.get(m.group(1), j) < j:
            bodies.append(lines[labels[m.group(1)] : j + 1])
    return bodies


def loop_stats(ptx: str, which: int | None = None) -> LoopStats:
    """Counts over every loop of the kernel, or over loop ``which`` alone (0: the first)."""
    bodies = _loop_bodies(ptx)
    loops = len(bodies)
    if which is not None:
        bodies = [bodies[which]]
    text = "\n".join(line for body in bodies for line in body)

    def count(pattern: str) -> int:
        return len(re.findall(pattern, text))

    return LoopStats(
        loops=loops,
        loads_16b=count(r"\bld\.global(?:\.[\w:]+)*\.v4\.(?:b32|u32|f32)"),
        loads=count(r"\bld\.global"),
        shared=count(r"\b(?:ld|st)\.shared"),
        barriers=count(r"\bbar\.sync"),
        prmt=count(r"\bprmt\b"),
        shuffles=count(r"\bshfl\."),
    )


def resource_usage(kernel: Any) -> dict[str, int]:
    """{"REG": registers per thread, "STACK": bytes of stack (spills), "SHARED": ...} of a
    compiled kernel, read by cuobjdump from its cubin; {} where no cuobjdump is found (triton's
    NVIDIA backend ships one in its bin/ folder)."""
    import triton.backends.nvidia as nvidia_backend

    tool = Path(nvidia_backend.__file__).parent / "bin" / "cuobjdump"
    exe = str(tool) if tool.exists() else shutil.which("cuobjdump")
    if exe is None:
        return {}
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        out = subprocess.run(
            [exe, "--dump-resource-usage", f.name], capture_output=True, text=True, check=True
        ).stdout
    return {k: int(v) for k, v in re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", out)}
