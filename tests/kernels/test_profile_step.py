"""bench/profile_step.py's --variant: launch-table entries swapped for one timing, then restored
(here, not in tests/commands: importing the kernels modules before tests/kernels/conftest.py sets
TRITON_INTERPRET would compile them for a GPU and break the interpreted kernel tests)."""

from __future__ import annotations

import pytest

from bench.profile_step import _table_entry, _table_variant
from kernels import fp8_gemv, fp8_mma, nvfp4_gemv


def test_variant_entries_parse_per_table() -> None:
    table, key, cfg = _table_entry("fp8_mma 6144:4096:0:1=4,2,0")
    assert table is fp8_mma.TABLE and key == (6144, 4096, False, 1)
    assert cfg == fp8_mma.Fp8MmaConfig(4, 2, 0)
    table, key, cfg = _table_entry("nvfp4 4096:12288:1 = 8,2,1,1")
    assert table is nvfp4_gemv.TABLE and key == (4096, 12288, 1)
    assert cfg == nvfp4_gemv.Nvfp4GemvConfig(8, 2, 1, mma=True)
    assert _table_entry("fp8_gemv 6144:4096:0:1=none")[2] is None
    with pytest.raises(SystemExit, match="unknown table"):
        _table_entry("cublas 1:2:0:1=1,1,1")


def test_variant_is_undone_after_the_timing() -> None:
    """Entries replaced inside the block (including ones the table lacked) are back as they were
    after it, so the next variant is timed against the committed tables."""
    before_mma, before_fma = dict(fp8_mma.TABLE), dict(fp8_gemv.TABLE)
    absent = (123, 4096, False, 1)
    assert absent not in fp8_mma.TABLE
    spec = "fp8_mma 123:4096:0:1=2,2,0; fp8_gemv 6144:4096:0:1=none"
    with _table_variant(spec):
        assert fp8_mma.TABLE[absent] == fp8_mma.Fp8MmaConfig(2, 2, 0)
        assert fp8_gemv.TABLE[(6144, 4096, False, 1)] is None
    assert fp8_mma.TABLE == before_mma and fp8_gemv.TABLE == before_fma


def test_dense_variants_are_refused_as_the_plan_chooses_them() -> None:
    """Dense GEMM launches are chosen when the plan is compiled: swapping the kernel module's
    table at run time would change nothing, so the variant is refused rather than timed."""
    with pytest.raises(SystemExit, match="dense GEMM launches are the plan's"):
        _table_entry("dense 4096:4096:0:1=1,4,2")
