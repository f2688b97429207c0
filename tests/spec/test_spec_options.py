"""The speculative flags of `ninfer serve` reach the engine options, and wrong combinations are
refused with one line naming the flag (the artifact's components are checked at startup)."""

from __future__ import annotations

import argparse

import pytest

from ninfer.api.server.config import ServeConfig, check_capabilities
from ninfer.commands import serve
from ninfer.errors import ConfigError
from ninfer.runtime.config import EngineOptions


def parse(*argv: str) -> ServeConfig:
    p = argparse.ArgumentParser()
    serve.add_arguments(p)
    return serve.config_from_args(p.parse_args(list(argv)), cuda_available=False)


def test_spec_draft_reaches_the_engine_options():
    cfg = parse("--spec", "draft", "--draft-model", "small.ninfer")
    assert (cfg.engine.spec, cfg.engine.draft_model, cfg.engine.draft_tokens) == (
        "draft", "small.ninfer", 4,
    )  # fmt: skip
    cfg = parse("--spec", "draft", "--draft-model", "small.ninfer", "--draft-tokens", "7")
    assert cfg.engine.draft_tokens == 7
    check_capabilities(cfg, ["text"])  # a draft model needs no component of the target
    assert parse().engine.spec is None


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--spec", "draft"], "--spec draft needs --draft-model"),
        (["--draft-model", "x.ninfer"], "--draft-model needs --spec draft"),
        (["--spec", "draft", "--draft-model", "x", "--draft-tokens", "16"], "--draft-tokens must be in 1..15"),
        (["--spec", "draft", "--draft-model", "x", "--lm-head-draft"], "--lm-head-draft requires --spec mtp"),
    ],
)  # fmt: skip
def test_wrong_combinations_name_the_flag(argv, message):
    with pytest.raises(ConfigError, match=message) as e:
        parse(*argv)
    assert "\n" not in str(e.value)


def test_a_backend_without_its_component_is_refused_naming_it():
    with pytest.raises(ConfigError, match="--spec mtp needs the artifact's mtp component"):
        check_capabilities(parse("--spec", "mtp"), ["text"])


def test_engine_options_validate_the_speculative_fields():
    with pytest.raises(ConfigError, match="--spec draft and --draft-model"):
        EngineOptions.of(spec="draft")
    with pytest.raises(ConfigError, match="--spec dflash2: the engine runs draft, mtp, dflash"):
        EngineOptions.of(spec="dflash2")
    with pytest.raises(ConfigError, match="--lm-head-draft requires --spec mtp"):
        EngineOptions.of(spec="draft", draft_model="x", lm_head_draft=True)
    with pytest.raises(ConfigError, match="--draft-tokens must be in 1..15"):
        EngineOptions.of(spec="draft", draft_model="x", draft_tokens=0)
