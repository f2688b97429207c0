"""`ninfer convert ... --dflash DIR` attaches a DFlash drafter in its published Hugging Face
layout as the artifact's dflash component (to a model being converted, or to an existing
.ninfer); `inspect` lists it, `compile` declares it and `compile --spec dflash` captures the
drafter's target layers and prints its shape; a drafter that does not fit the model is refused
with one line naming --dflash and what is wrong, and nothing is written."""

from __future__ import annotations

import argparse
import json
import re
import shutil

import pytest

from artifacts.fixture_dflash import dflash_config, random_state, save_hf
from ninfer import cli
from ninfer.artifact.format import Artifact
from ninfer.commands import convert
from ninfer.errors import ConvertError


@pytest.fixture(scope="module")
def drafter_dir(fixture_hf_dir, tmp_path_factory):
    """A random drafter for the qwen3 fixture: one layer, block 8, target layers 0 and 1."""
    cfg = dflash_config(json.loads((fixture_hf_dir("qwen3") / "config.json").read_text()))
    return save_hf(tmp_path_factory.mktemp("drafter") / "qwen3-dflash", cfg, random_state(cfg, 1), "bfloat16")  # fmt: skip


def test_convert_attaches_and_inspect_and_compile_show_it(
    drafter_dir, fixture_hf_dir, fixture_artifacts, tmp_path, capsys
):
    from_hf = tmp_path / "from-hf.ninfer"
    assert cli.main(["convert", str(fixture_hf_dir("qwen3")), "-o", str(from_hf), "--dflash", str(drafter_dir)]) == 0  # fmt: skip
    from_art = tmp_path / "from-artifact.ninfer"
    assert cli.main(["convert", str(fixture_artifacts("qwen3")), "-o", str(from_art), "--dflash", str(drafter_dir)]) == 0  # fmt: skip
    for path in (from_hf, from_art):
        a = Artifact(path)
        assert a.components == ["text", "dflash"]
        assert a.header["dflash"]["block_size"] == 8
        assert a.info("dflash.fc.weight").shape == (64, 128)
        assert a.info("dflash.layers.0.self_attn.q_proj.weight").format == "bf16"
        base = Artifact(fixture_artifacts("qwen3"))  # the model's tensors are carried unchanged
        assert {n for n in a if not n.startswith("dflash.")} == set(base)
        for n in base:
            assert a.info(n).format == base.info(n).format
            assert (a.array(n) == base.array(n)).all(), n
    capsys.readouterr()
    assert cli.main(["inspect", str(from_art), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["components"] == ["text", "dflash"]
    assert cli.main(["compile", str(from_art)]) == 0
    assert "declared: dflash(" in capsys.readouterr().out
    assert cli.main(["compile", str(from_art), "--spec", "dflash"]) == 0
    out = capsys.readouterr().out
    assert "== dflash" in out and "captures          ['L0', 'L1']" in out
    assert "block_size        8" in out


def _broken(drafter_dir, tmp_path, edit_config=None, drop=None):
    bad = tmp_path / "bad"
    shutil.copytree(drafter_dir, bad)
    if edit_config:
        cfg = json.loads((bad / "config.json").read_text())
        edit_config(cfg)
        (bad / "config.json").write_text(json.dumps(cfg))
    if drop:
        from safetensors.torch import load_file, save_file

        state = load_file(str(bad / "model.safetensors"))
        del state[drop]
        save_file(state, str(bad / "model.safetensors"))
    return bad


@pytest.mark.parametrize(
    ("edit", "drop", "message"),
    [
        (lambda c: c["dflash_config"].update(target_layer_ids=[0, 5]), None, r"target_layer_ids \[0, 5\] must name layers of the target \(0\.\.1\)"),
        (lambda c: c.update(hidden_size=32), None, "hidden_size 32 differs from the target's 64"),
        (lambda c: c.update(num_target_layers=36), None, "num_target_layers 36: the drafter was trained for a model of that many layers, this one has 2"),
        (lambda c: c.update(block_size=1), None, "block_size must be an integer >= 2"),
        (lambda c: c["dflash_config"].pop("mask_token_id"), None, "mask_token_id must be a token id"),
        (None, "norm.weight", "missing tensor 'norm.weight'"),
    ],
)  # fmt: skip
def test_a_drafter_that_does_not_fit_is_refused(
    edit, drop, message, drafter_dir, fixture_artifacts, tmp_path, capsys
):
    bad = _broken(drafter_dir, tmp_path, edit, drop)
    out = tmp_path / "out.ninfer"
    capsys.readouterr()
    assert cli.main(["convert", str(fixture_artifacts("qwen3")), "-o", str(out), "--dflash", str(bad)]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert err.startswith(f"ninfer convert: error: --dflash {bad}: ") and err.count("\n") == 1
    assert re.search(message, err), err
    assert not out.exists() and not list(tmp_path.glob("out.ninfer.tmp-*"))


def test_dflash_must_name_a_directory(fixture_artifacts, tmp_path):
    with pytest.raises(ConvertError, match="--dflash .*nothing: not a directory"):
        convert.run(convert_args(fixture_artifacts("qwen3"), tmp_path / "o.ninfer", tmp_path / "nothing"))  # fmt: skip


def convert_args(src, out, dflash):
    p = argparse.ArgumentParser()
    convert.add_arguments(p)
    return p.parse_args([str(src), "-o", str(out), "--dflash", str(dflash)])
