"""The dense GEMM launches the compiler reads from the measured tables (gemv_table.json,
skinny_table.json): per row bucket the table's entry (none: cuBLAS), the batch-1 default for an
unmeasured weight, merged ranges; and a cuda plan carries them where its GEMMs run."""

from __future__ import annotations

from ninfer.artifact import Artifact
from ninfer.ir.plan import launch_for
from ninfer.passes.gemm_launch import (
    CUBLAS,
    GEMV,
    GEMV_DEFAULT_M1,
    SKINNY,
    dense_launches,
    read_gemv_table,
    read_skinny_table,
)
from ninfer.passes.options import CompileOptions
from ninfer.passes.pipeline import compile_artifact


def _tables(tmp_path, gemv: str, skinny: str):
    (tmp_path / "g.json").write_text(gemv)
    (tmp_path / "s.json").write_text(skinny)
    return (*read_gemv_table(tmp_path / "g.json"), read_skinny_table(tmp_path / "s.json"))


def test_measured_shapes_follow_the_tables_per_row_bucket(tmp_path) -> None:
    t = _tables(
        tmp_path,
        '{"64:32:0": {"1": [2, 4, 1], "4": [4, 8, 1]}, "96:32:1": {}}',
        '{"64:32": {"8": [32, 256, 4, 4]}}',
    )
    got = dense_launches(64, 32, False, t)
    # M = 2: cuBLAS won there; 3-4 share the M = 4 entry; 5-8 the tiles; 9-16 none (cuBLAS)
    assert got == [
        [1, 1, GEMV, [2, 4, 1]],
        [3, 4, GEMV, [4, 8, 1]],
        [5, 8, SKINNY, [32, 256, 4, 4]],
    ]
    assert [launch_for(got, m, CUBLAS)[0] for m in (1, 2, 3, 4, 6, 12, 100)] == [
        GEMV, CUBLAS, GEMV, GEMV, SKINNY, CUBLAS, CUBLAS
    ]  # fmt: skip
    assert dense_launches(96, 32, True, t) == []  # measured, cuBLAS at every M
    # glu unmeasured: the batch-1 default; the tiles (keyed without glu) take silu(gate) * up
    assert dense_launches(64, 32, True, t) == [
        [1, 1, GEMV, list(GEMV_DEFAULT_M1)], [5, 8, SKINNY, [32, 256, 4, 4]]
    ]  # fmt: skip


def test_a_cuda_plan_names_its_gemm_launches(fixture_artifacts) -> None:
    a = Artifact(fixture_artifacts("llama"))
    cuda = compile_artifact(a, CompileOptions(device="cuda", max_concurrency=4))
    gemms = [c for c in cuda.calls if c.op in ("linear", "logits")]
    assert gemms and all(c.kernel == CUBLAS for c in gemms)
    assert all(c.attrs["launch"] == [[1, 1, GEMV, list(GEMV_DEFAULT_M1)]] for c in gemms)
    cpu = compile_artifact(a, CompileOptions(device="cpu"))
    assert not any("launch" in c.attrs for c in cpu.calls)


def test_the_committed_tables_are_read() -> None:
    """The compiler reads the tables the sweeps write beside the kernels (an absent file would
    silently mean "cuBLAS everywhere but batch 1")."""
    from ninfer.passes.gemm_launch import KERNELS_DIR, _tables

    assert (KERNELS_DIR / "gemv_table.json").exists() and (
        KERNELS_DIR / "skinny_table.json"
    ).exists()
    gemv, measured, skinny = _tables()
    assert (4096, 4096, False) in measured and gemv and skinny
    # Qwen3-8B's o projection: the measured GEMV at 1 and 2 rows, the tiles at 5-16
    assert [k for _, _, k, _ in dense_launches(4096, 4096, False)][:2] == [GEMV, GEMV]
