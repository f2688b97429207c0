"""Generation defaults recorded at convert time (generation_config.json, GGUF general.sampling.*,
`--generation-defaults`, the demo's model card) and read back as the sampler defaults; an
artifact without them samples with the plain defaults."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from ninfer.api.service.sampling import SamplerPolicy
from ninfer.artifact import Artifact
from ninfer.artifact.convert_gguf import convert_gguf
from ninfer.artifact.convert_hf import convert_hf
from ninfer.artifact.demo import DEMO_GENERATION
from ninfer.artifact.format import ArtifactWriter, StoredTensor
from ninfer.artifact.generation import PLAIN, artifact_defaults, effective_defaults, parse_defaults
from tests.artifact.test_gguf_convert import FFN, tiny_llama

SAMPLING = {
    "general.sampling.temp": 0.7,
    "general.sampling.top_p": 0.8,
    "general.sampling.top_k": 40,
}


def test_effective_defaults_read_what_is_recorded():
    assert effective_defaults({}) == PLAIN == effective_defaults(None)
    got = effective_defaults({"temperature": 0.6, "top_p": 0.95, "top_k": 20, "do_sample": True})
    assert got == dict(PLAIN, temperature=0.6, top_p=0.95, top_k=20)
    assert isinstance(got["top_k"], int)
    # transformers' greedy switch; fields out of range or of the wrong type are ignored
    assert effective_defaults({"temperature": 0.6, "do_sample": False})["temperature"] == 0.0
    assert (
        effective_defaults({"temperature": -1, "top_p": "0.5", "top_k": 2.5, "min_p": True})
        == PLAIN
    )


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("temperature", "expected NAME=VALUE"),
        ("temprature=0.2", "expected NAME=VALUE"),
        ("top_p=high", "not a float"),
        ("top_p=1.5", "outside 0..1"),
        ("top_k=0.5", "not a int"),
        ("", "give at least one"),
    ],
)
def test_parse_defaults_names_the_bad_item(text, needle):
    with pytest.raises(ValueError) as e:
        parse_defaults(text)
    assert needle in str(e.value) and str(e.value).startswith("--generation-defaults")


def test_parse_defaults():
    assert parse_defaults("temperature=0.2, top_p=0.9,top_k=40") == {
        "temperature": 0.2,
        "top_p": 0.9,
        "top_k": 40,
    }


def test_gguf_sampling_keys_recorded_and_overridden(tmp_path, write_gguf):
    src = write_gguf(
        tmp_path / "s.gguf",
        tiny_llama(np.random.default_rng(0)),
        hparams={"feed_forward_length": FFN},
        metadata=SAMPLING,
    )
    a = Artifact(convert_gguf(src, tmp_path / "a.ninfer"))
    assert a.generation == pytest.approx({"temperature": 0.7, "top_p": 0.8, "top_k": 40})
    assert artifact_defaults(a)["top_k"] == 40
    a.close()
    a = Artifact(convert_gguf(src, tmp_path / "b.ninfer", generation={"temperature": 0.2}))
    assert a.generation == pytest.approx({"temperature": 0.2, "top_p": 0.8, "top_k": 40})
    a.close()


def test_gguf_without_sampling_keys_records_none(tmp_path, write_gguf):
    src = write_gguf(
        tmp_path / "s.gguf",
        tiny_llama(np.random.default_rng(0)),
        hparams={"feed_forward_length": FFN},
    )
    a = Artifact(convert_gguf(src, tmp_path / "a.ninfer"))
    assert a.generation == {} and artifact_defaults(a) == PLAIN
    a.close()


def test_cli_option_over_generation_config(fixture_hf_dir, tmp_path):
    d = tmp_path / "hf"
    shutil.copytree(fixture_hf_dir("llama"), d)
    (d / "generation_config.json").write_text(
        json.dumps({"temperature": 0.6, "top_p": 0.95, "do_sample": True, "_from_model_config": 1})
    )
    out = tmp_path / "a.ninfer"
    r = subprocess.run(
        [sys.executable, "-m", "ninfer.cli", "convert", str(d), "-o", str(out),
         "--generation-defaults", "top_p=0.5,min_p=0.05"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    a = Artifact(out)
    assert artifact_defaults(a) == dict(PLAIN, temperature=0.6, top_p=0.5, min_p=0.05)
    assert "_from_model_config" not in a.generation
    a.close()
    shown = subprocess.run(
        [sys.executable, "-m", "ninfer.cli", "inspect", str(out)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "sampling        temperature 0.6, top_p 0.5, min_p 0.05 (recorded)\n" in shown
    bad = subprocess.run(
        [sys.executable, "-m", "ninfer.cli", "convert", str(d), "-o", str(tmp_path / "b.ninfer"),
         "--generation-defaults", "heat=2"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert "--generation-defaults 'heat=2'" in bad.stderr
    assert not (tmp_path / "b.ninfer").exists()


def test_hf_convert_keeps_generation_config_with_overrides(fixture_hf_dir, tmp_path):
    d = tmp_path / "hf"
    shutil.copytree(fixture_hf_dir("llama"), d)
    (d / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "top_k": 20}))
    a = Artifact(convert_hf(d, tmp_path / "a.ninfer", generation={"temperature": 0.3}))
    assert artifact_defaults(a) == dict(PLAIN, temperature=0.3, top_k=20)
    a.close()


def test_an_artifact_without_the_field_samples_with_the_plain_defaults(tmp_path):
    header = {"architecture": "llama", "config": {}, "tokenizer": "{}"}
    with ArtifactWriter(tmp_path / "old.ninfer", header) as w:
        w.add("x", StoredTensor("f32", (2,), {"data": np.zeros(2, np.float32)}))
    a = Artifact(tmp_path / "old.ninfer")
    assert "generation" not in a.header and artifact_defaults(a) == PLAIN
    assert SamplerPolicy("llama", a.generation).resolve(False, {})["temperature"] == 1.0
    a.close()


def test_demo_records_its_model_card_defaults_and_the_server_uses_them(demo_artifact):
    a = Artifact(demo_artifact)
    assert a.generation == DEMO_GENERATION == {"temperature": 0.2, "top_p": 0.9}
    policy = SamplerPolicy(a.architecture, a.generation)
    a.close()
    got = policy.resolve(False, {"temperature": None, "top_p": None})
    assert (got["temperature"], got["top_p"]) == (0.2, 0.9)
    assert policy.resolve(False, {"temperature": 0.7})["temperature"] == 0.7  # a request wins
