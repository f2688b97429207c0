"""Context limits `ninfer serve` serves but cannot fully honour start with a warning, not a
refusal (--max-context's default is fixed at 8192 and lets --kv-capacity be set apart
from it): a KV pool smaller than one --max-context sequence (prompts longer than the pool are
then refused per request, naming --kv-capacity), and a --max-context beyond the model's trained
context (logged as llama.cpp's server does)."""

from __future__ import annotations

import argparse
import logging

import pytest

from ninfer.api.server.config import (
    ServeConfig,
    kv_pool_warning,
    model_context_warning,
    trained_context,
)
from ninfer.artifact import Artifact
from ninfer.commands import serve
from tests.api.live_app import app_client, serve_config

MODEL = "tiny-agent"


def parse(*argv: str) -> ServeConfig:
    p = argparse.ArgumentParser()
    serve.add_arguments(p)
    return serve.config_from_args(p.parse_args(list(argv)), cuda_available=False)


# -- a KV pool smaller than --max-context ---------------------------------------------------------


def test_kv_pool_warning_names_both_values():
    cfg = parse("--max-context", "1024", "--kv-capacity", "100")  # accepted
    assert cfg.engine.compile.kv_capacity == 100 and cfg.engine.max_context == 1024
    message = kv_pool_warning(cfg, 100)
    assert message is not None and "\n" not in message
    assert message.startswith("--kv-capacity 100 gives a KV pool of 100 tokens, smaller than")
    assert "--max-context 1024" in message and "longer than 100 tokens will be refused" in message
    assert kv_pool_warning(serve_config(kv_capacity="auto", max_context=8192), 4096).startswith(
        "--kv-capacity auto gives a KV pool of 4096 tokens"
    )
    assert kv_pool_warning(cfg, 1024) is None and kv_pool_warning(cfg, 5000) is None


def test_small_kv_pool_serves_with_a_warning_and_refuses_longer_prompts(tiny_agent, caplog):
    with (
        caplog.at_level(logging.WARNING, logger="ninfer.serve"),
        app_client(tiny_agent, max_context=1024, kv_capacity=64) as client,
    ):
        warned = [r.getMessage() for r in caplog.records if "KV pool of" in r.getMessage()]
        assert len(warned) == 1 and "--max-context 1024" in warned[0], warned
        # the effective ceiling: no sequence outgrows the pool
        assert client.get("/v1/models").json()["data"][0]["max_model_len"] == 64
        ok = client.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        )
        assert ok.status_code == 200, ok.text
        long = client.post(
            "/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": "hi " * 120}],
                "max_tokens": 2,
            },
        )
        assert long.status_code == 400, long.text
        err = long.json()["error"]
        assert "--kv-capacity" in err["message"]
        assert (err["code"], err["param"]) == ("context_length_exceeded", "messages")
        capped = client.post(  # output stops at the pool: a context finish, not max_tokens
            "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                  "max_tokens": 500, "ignore_eos": True},
        )  # fmt: skip
        assert capped.status_code == 200, capped.text
        usage = capped.json()["usage"]
        assert usage["prompt_tokens"] + usage["completion_tokens"] == 64
        assert capped.json()["choices"][0]["finish_reason"] == "length"


# -- --max-context beyond the trained context ----------------------------------------------------


def test_max_context_beyond_the_trained_context_starts_with_a_warning(tiny_agent, caplog):
    """The tiny agent was trained with max_position_embeddings 2048."""
    assert trained_context(Artifact(tiny_agent).config) == 2048
    with caplog.at_level(logging.WARNING, logger="ninfer.serve"):
        assert serve.open_artifact(parse(str(tiny_agent), "--max-context", "4096")).name
    assert [r.getMessage() for r in caplog.records] == [
        (
            "--max-context 4096 exceeds the model's trained context length of 2048 tokens "
            "(max_position_embeddings 2048 in the artifact's config): output past 2048 tokens "
            "degrades; use --max-context 2048 to stay within it"
        )
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ninfer.serve"):
        serve.open_artifact(parse(str(tiny_agent)))  # the default 8192 is served too
        assert "--max-context 8192 exceeds" in caplog.text
        caplog.clear()
        serve.open_artifact(parse(str(tiny_agent), "--max-context", "2048"))
    assert not caplog.records


@pytest.mark.parametrize(
    ("config", "limit"),
    [
        ({"max_position_embeddings": 4096}, 4096),
        ({}, None),  # not given: nothing to check against
        ({"max_position_embeddings": 4096, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}, 8192),
        # Qwen3's YaRN recipe: factor 4 over the original 32768 positions
        ({"max_position_embeddings": 40960, "rope_scaling": {
            "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}, 131072),
        ({"max_position_embeddings": 40960, "rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, 163840),
        # llama3 scaling is already counted in max_position_embeddings
        ({"max_position_embeddings": 131072, "rope_scaling": {
            "rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}}, 131072),
        ({"max_position_embeddings": 2048, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}, 2048),
    ],
)  # fmt: skip
def test_trained_context_follows_rope_scaling(config, limit):
    assert trained_context(config) == limit
    if limit is not None:
        assert model_context_warning(serve_config(max_context=limit), config) is None
        warning = model_context_warning(serve_config(max_context=limit + 1), config)
        assert f"trained context length of {limit} tokens" in warning
