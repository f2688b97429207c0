"""Sampler resolution: presets by architecture and thinking mode, flags, request, --greedy."""

from __future__ import annotations

from ninfer.api.service.sampling import FIELDS, SamplerPolicy

NONE = dict.fromkeys((*FIELDS, "seed"))  # a request that sets no sampler field


def test_qwen35_presets_follow_the_thinking_mode():
    p = SamplerPolicy("qwen3_5")
    think = p.resolve(True, NONE)
    assert (
        think["temperature"],
        think["top_p"],
        think["top_k"],
        think["min_p"],
        think["presence_penalty"],
    ) == (1.0, 0.95, 20, 0.0, 0.0)
    plain = p.resolve(False, NONE)
    assert (plain["temperature"], plain["top_p"], plain["top_k"], plain["presence_penalty"]) == (
        0.7,
        0.8,
        20,
        1.5,
    )
    assert plain["frequency_penalty"] == 0.0
    assert SamplerPolicy("qwen3_5_moe").resolve(True, NONE)["presence_penalty"] == 1.5


def test_flags_override_presets_and_request_overrides_flags():
    p = SamplerPolicy("qwen3_5", overrides={"temperature": 0.3, "top_k": 5, "seed": 11})
    r = p.resolve(True, NONE)
    assert r["temperature"] == 0.3 and r["top_k"] == 5 and r["seed"] == 11 and r["top_p"] == 0.95
    r = p.resolve(True, dict(NONE, temperature=0.9, seed=-3))
    assert r["temperature"] == 0.9 and r["seed"] == -3


def test_greedy_forces_temperature_zero_last():
    p = SamplerPolicy("qwen3_5", overrides={"temperature": 0.5}, greedy=True)
    assert p.resolve(False, dict(NONE, temperature=1.2))["temperature"] == 0.0


def test_top_k_zero_selects_the_cap_of_twenty():
    p = SamplerPolicy("llama")
    assert p.resolve(False, NONE)["top_k"] == 20
    assert p.resolve(False, dict(NONE, top_k=0))["top_k"] == 20
    assert p.resolve(False, dict(NONE, top_k=7))["top_k"] == 7


def test_architectures_without_presets_use_generation_config():
    p = SamplerPolicy(
        "qwen3", generation={"temperature": 0.6, "top_p": 0.95, "top_k": 20, "do_sample": True}
    )
    r = p.resolve(True, NONE)
    assert (r["temperature"], r["top_p"], r["top_k"]) == (0.6, 0.95, 20)
    assert (
        SamplerPolicy("llama", generation={"do_sample": False}).resolve(False, NONE)["temperature"]
        == 0.0
    )
    assert SamplerPolicy("llama").resolve(False, NONE)["temperature"] == 1.0


def test_a_process_top_p_of_zero_is_argmax_like_a_request_one():
    p = SamplerPolicy("llama", overrides={"top_p": 0.0, "temperature": 0.8})
    r = p.resolve(False, NONE)
    assert (r["temperature"], r["top_p"]) == (0.0, 1.0)
    assert p.resolve(False, dict(NONE, top_p=0.5))["top_p"] == 0.5  # the request's wins
