"""`ninfer compile --tensor-parallel N`: every rank's plan, its part of the model and the
collectives, in text and JSON; impossible N refused with one line naming the numbers."""

from __future__ import annotations

import json

import pytest

from ninfer.cli import main
from ninfer.ir.plan import Plan


def compile_out(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["compile", *argv])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_every_rank_and_its_collectives_are_printed(fixture_artifacts, capsys) -> None:
    path = str(fixture_artifacts("qwen3_5"))
    rc, whole, err = compile_out(capsys, path, "--max-concurrency", "2")
    assert rc == 0, err
    rc, out, err = compile_out(capsys, path, "--max-concurrency", "2", "--tensor-parallel", "2")
    assert rc == 0, err
    ranks = out.split("== rank ")[1:]
    assert [r.splitlines()[0] for r in ranks] == ["0 of 2 ==", "1 of 2 =="]
    for r, text in enumerate(ranks):
        assert (
            f"tensor parallel: rank {r} of 2 (torch.distributed: nccl on cuda, gloo on cpu)" in text
        )
        assert "passes: verify -> shard -> fuse_qkv" in text
        assert "collectives: all_reduce x8 all_gather x1" in text
        assert "  all_reduce x4   L*.attn_out: f32[T,64] -> f32[T,64]" in text
        assert "  all_reduce x4   L*.mlp_out: f32[T,64] -> f32[T,64]" in text
        assert "  all_gather x1   logits.part: f32[R,256] -> f32[R,512]" in text
        assert "dist.all_reducex8" in text and "dist.all_gatherx1" in text
        assert "k: f32[pages, page_size, 1, 16]" in text  # one of the two KV heads
    assert "k: f32[pages, page_size, 2, 16]" in whole and "tensor parallel" not in whole
    # per-rank KV and state: half the bytes of the whole model
    per_token = [
        int(line.split("bytes/token=")[1]) for line in out.splitlines() if "bytes/token=" in line
    ]
    whole_token = int(whole.split("bytes/token=")[1].split()[0])
    assert per_token == [whole_token // 2] * 2


def test_json_is_a_list_of_rank_plans(fixture_artifacts, capsys) -> None:
    rc, out, err = compile_out(
        capsys, str(fixture_artifacts("qwen3_moe")), "--tensor-parallel", "2", "--json"
    )
    assert rc == 0, err
    plans = [Plan.from_dict(d) for d in json.loads(out)]
    assert [(p.parallel.rank, p.parallel.world) for p in plans] == [(0, 2), (1, 2)]
    q = plans[1].buffers["model.layers.0.self_attn.q_proj+k_proj+v_proj.weight"]
    assert q.type == "f32[64,64]" and {s.index for s in q.shards} == {1}


@pytest.mark.parametrize(
    ("n", "message"),
    [
        ("4", "--tensor-parallel 4: the model has 4 attention heads and 2 KV heads; both must be divisible by 4"),
        ("3", "--tensor-parallel must be a power of two (1, 2, 4, 8, ...), got 3"),
        ("0", "--tensor-parallel must be in 1..64, got 0"),
    ],
)  # fmt: skip
def test_impossible_tensor_parallel_is_refused(n, message, fixture_artifacts, capsys) -> None:
    path = str(fixture_artifacts("llama"))
    capsys.readouterr()  # the fixture's build progress, when this test builds it
    rc, out, err = compile_out(capsys, path, "--tensor-parallel", n)
    assert rc == 2 and out == ""
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
