"""`--lm-head-draft`'s private draft weights as the drafters read them: fp8 rows on CUDA.

`Fp8Rows` is one such weight; `DraftHead` is the reduced head (an Fp8Rows with its token ids).
The DFlash drafter's layers take Fp8Rows too under --lm-head-draft (ninfer/spec/dflash_graph.py).

The reduced head (ninfer/spec/draft_vocab.py: N = 32768 rows of a large vocabulary's LM head)
is read in full by every draft step; in bf16 on the H200 that is 268 MB of the MTP head's
~720 MB per step, and the DFlash drafter reads it for every block. On CUDA a `DraftHead` holds
it in the project's `fp8` weight format (kernels/quant_gemm.py: e4m3 bytes, one fp32 scale per
row, quantised once when the head is built): half the bytes. Its logits then differ from the
bf16 head's by the quantisation error, which can change which token is drafted only where the
top two are that close; verification stays with the target's full head, so output is
unchanged. Elsewhere (CPU) the rows stay in the model dtype and the logits are the plain matmul
the drafters computed before. `fp8=False` keeps the model dtype on CUDA too.

fp8 launches, chosen once per row count (host-only; the call is captured in CUDA Graphs):

    1 row         kernels/fp8_mma.py (tensor cores) where its table names a shape and x is
                  bf16 on sm_89+, else kernels/fp8_gemv.py (its table's shape or default)
    2-4 rows      kernels/fp8_gemv.py where its table names a shape for that many rows
    5-16 rows     kernels/fp8_skinny.py's tensor-core tiles where its table (or the nearest
                  measured width's) names a shape
    else <= 16    quant_linear's tensor-core tiles (kernels/quant_gemm.py: the weight read once
                  per 16 rows, dequantised in registers)
    17 or more    the model-dtype rows (kept beside the fp8 ones; `fp8_max_rows`)

The sweeps measured the model's projections, not the reduced head: a head shape they did not
measure takes the entries of the nearest measured width of the same depth, as the DFlash
graph's skinny tiles do. For Qwen3-8B's 32768 x 4096 head that is 24576 x 4096, where the H200
took (us; bench/results/gemv_h200.md, dense_gemv_h200.md, fp8_gemv_h200.md, fp8_mma_h200.md):

    rows                     1      2      4      16     64
    bf16 (cuBLAS)            49.9   62.7   49.9   50.3   52.4   (kernels.gemv: 47.0 at 1 row)
    fp8_mma                  25.6
    fp8_gemv                 26.9   30.8   60.2
    quant_linear's GEMV      32.6   29.7   46.8   170.4
    quant_linear's tiles            28.8   28.9   29.6   58.8

so the fp8 rows serve up to 16 rows (one M tile) and the bf16 rows wider calls (the DFlash
drafter's blocks of more than one sequence), at 134 MB more memory for that head.

bf16 on CUDA: the launch the dense sweeps chose for that shape and row count, as the DFlash
graph's GEMMs (ninfer/spec/gemm.py `dense_gemm`: kernels.gemv, skinny tiles, cuBLAS).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

FP8_MMA = "triton.fp8_mma"
FP8_GEMV = "triton.fp8_gemv"
FP8_SKINNY = "triton.fp8_skinny"
QUANT_LINEAR = "quant_linear"  # config: its path, "tiled" or "dense"
FP8_MAX_ROWS = 16  # widest call the fp8 rows serve by default (module docstring)
QUANTISE_ROWS = 4096  # rows quantised at a time: a bounded fp32 scratch at build


class Launch(NamedTuple):
    """The kernel the fp8 head runs for some number of rows, and its launch shape."""

    kernel: str
    config: Any


def measured_width(N: int, K: int) -> int:
    """N when the fp8 sweeps measured an [N, K] weight; else the nearest measured width of depth
    K (by bit length; the smaller on a tie), or N when none has that depth."""
    from kernels.fp8_gemv import TABLE as GEMV_TABLE
    from kernels.fp8_mma import TABLE as MMA_TABLE

    widths = {n for n, k, glu, _ in (*GEMV_TABLE, *MMA_TABLE) if k == K and not glu}
    if N in widths or not widths:
        return N
    return min((abs(n.bit_length() - N.bit_length()), n) for n in widths)[1]


def fp8_launch(N: int, K: int, M: int, tensor_cores: bool = True) -> Launch:
    """The launch for M rows of x against the [N, K] fp8 head (module docstring); without
    ``tensor_cores`` the one to take where fp8_mma cannot."""
    from kernels.fp8_gemv import fp8_gemv_config
    from kernels.fp8_mma import fp8_mma_config
    from kernels.fp8_skinny import MAX_M, fp8_skinny_config
    from kernels.quant_gemm import DENSE_MIN_M

    n = measured_width(N, K)
    if tensor_cores and M == 1 and (mma := fp8_mma_config(n, K, 1)) is not None:
        return Launch(FP8_MMA, mma)
    if (gemv := fp8_gemv_config(n, K, M)) is not None:
        return Launch(FP8_GEMV, gemv)
    if 5 <= M <= MAX_M and (tiles := fp8_skinny_config(N, K, M)) is not None:
        return Launch(FP8_SKINNY, tiles)
    return Launch(QUANT_LINEAR, "dense" if M >= DENSE_MIN_M["fp8"] else "tiled")


class Fp8Rows:
    """A weight [N, hidden] the drafters multiply by (a reduced head, a DFlash layer's
    projection), owned here in `dtype` and, with `fp8`, as e4m3 bytes `data` [N, hidden] and
    fp32 row scales `scale` [N].

    `logits(h)` (or calling it) is `h @ rows.T`: [..., N] in `dtype` for h [..., hidden], on h's
    device; no host synchronisation, so it may run inside a CUDA Graph capture (the kernels
    allocate their outputs from the capturing pool)."""

    def __init__(
        self,
        rows: torch.Tensor,
        *,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        fp8: bool | None = None,
        fp8_max_rows: int | None = FP8_MAX_ROWS,
    ) -> None:
        """`rows` [N, hidden] float, on any device (quantised from these values: pass fp32
        rows to round once); they live on `device` (default rows') with logits in `dtype`
        (default rows'; rows already there in that dtype are kept, not copied). `fp8`
        (default: whether `device` is CUDA) stores e4m3 rows, which serve calls of up to
        `fp8_max_rows` rows (None: every call, and no `dtype` rows are kept); off CUDA that
        needs the Triton interpreter (TRITON_INTERPRET=1, as the kernels' CPU tests run)."""
        self.device = torch.device(device) if device is not None else rows.device
        self.dtype = dtype or rows.dtype
        self.fp8 = self.device.type == "cuda" if fp8 is None else fp8
        assert rows.dim() == 2, rows.shape
        self.shape = (int(rows.shape[0]), int(rows.shape[1]))
        # the widest call the fp8 rows serve (0: no fp8 rows; None: every call, no dtype rows)
        self.fp8_max_rows = fp8_max_rows if self.fp8 else 0
        self.rows: torch.Tensor | None = None  # [N, hidden] in dtype
        self.data: torch.Tensor | None = None
        self.scale: torch.Tensor | None = None
        if self.fp8:
            self.data, self.scale = _quantise(rows, self.device)
        if self.fp8_max_rows is not None:
            self.rows = rows.to(device=self.device, dtype=self.dtype)
        self._calls: dict[int, Callable[[torch.Tensor], torch.Tensor]] = {}

    @property
    def nbytes(self) -> int:
        """Bytes of the storage (rows shared with their owner counted too)."""
        held = (self.rows, self.data, self.scale)
        return sum(t.numel() * t.element_size() for t in held if t is not None)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """[..., N] in `dtype` of output rows h [..., hidden]."""
        x = h.to(self.dtype)
        if not self.fp8 and self.device.type != "cuda":
            return F.linear(x, self.rows)  # the drafters' matmul, unchanged
        flat = x.reshape(-1, self.shape[1]).contiguous()
        rows = flat.shape[0]
        call = self._calls.get(rows)
        if call is None:
            call = self._calls[rows] = self._choose(rows)
        return call(flat).view(*h.shape[:-1], self.shape[0])

    __call__ = logits

    def _choose(self, rows: int) -> Callable[[torch.Tensor], torch.Tensor]:
        """The kernel call for x [rows, hidden] (module docstring), chosen once."""
        N, K = self.shape
        w = self.rows
        if self.fp8_max_rows is not None and rows > self.fp8_max_rows:
            if self.device.type != "cuda":
                return lambda x: F.linear(x, w)
            from ninfer.spec.gemm import dense_gemm

            mm = dense_gemm(N, K, rows)
            return lambda x: mm(x, w)
        fallback = _fp8_call(fp8_launch(N, K, rows, tensor_cores=False), self.data, self.scale)
        launch = fp8_launch(N, K, rows)
        if launch.kernel != FP8_MMA:
            return fallback
        from kernels.fp8_mma import fp8_mma, usable

        q, s, cfg = self.data, self.scale, launch.config
        return lambda x: fp8_mma(x, q, s, cfg) if usable(x, q) else fallback(x)


class DraftHead(Fp8Rows):
    """The reduced draft head: token ids `ids` [N] int64 (ascending: logit column i is token
    ids[i]) and their LM head rows (Fp8Rows: `logits(h)` is what the drafters computed as
    `h @ rows.T`)."""

    def __init__(self, ids: torch.Tensor, rows: torch.Tensor, **options: Any) -> None:
        """`options`: Fp8Rows's (dtype, device, fp8, fp8_max_rows)."""
        super().__init__(rows, **options)
        assert ids.shape == rows.shape[:1], (ids.shape, rows.shape)
        self.ids = ids.to(self.device)


def _fp8_call(
    launch: Launch, q: torch.Tensor, s: torch.Tensor
) -> Callable[[torch.Tensor], torch.Tensor]:
    """x -> x @ (s * e4m3(q))ᵀ by `launch` (not fp8_mma, whose caller checks x per call)."""
    if launch.kernel == FP8_GEMV:
        from kernels.fp8_gemv import fp8_gemv

        return lambda x: fp8_gemv(x, q, s, launch.config)
    if launch.kernel == FP8_SKINNY:
        from kernels.fp8_skinny import fp8_skinny

        return lambda x: fp8_skinny(x, q, s, launch.config)
    from kernels.quant_gemm import quant_linear

    return lambda x: quant_linear(x, q, s, "fp8", path=launch.config)


def _quantise(rows: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 bytes [N, K] uint8, fp32 scales [N]) on `device` by the project's per-row
    quantiser, QUANTISE_ROWS rows at a time (the same values as all at once)."""
    from kernels.launch import interpreting
    from kernels.quant_gemm import quantize_weight_fp8

    if device.type != "cuda" and not interpreting():
        raise RuntimeError("an fp8 draft head runs Triton kernels: on CUDA, or interpreted")
    N, K = rows.shape
    data = torch.empty((N, K), dtype=torch.uint8, device=device)
    scale = torch.empty((N,), dtype=torch.float32, device=device)
    for i in range(0, N, QUANTISE_ROWS):
        q, s = quantize_weight_fp8(rows[i : i + QUANTISE_ROWS].to(device))
        data[i : i + QUANTISE_ROWS], scale[i : i + QUANTISE_ROWS] = q, s
    return data, scale
