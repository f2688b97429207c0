"""`ninfer serve` against a real artifact: capabilities it lacks are refused at startup in one
line, the model id it reports, and the files named by options are checked before the engine is built."""

from __future__ import annotations

import json
import logging

import pytest

from ninfer import cli
from ninfer.api.server.config import ServeConfig, check_capabilities, check_vision_plan
from ninfer.commands import serve
from ninfer.errors import ConfigError
from ninfer.runtime.config import EngineOptions
from tests.api.serve_helpers import make_artifact, parse

# -- capabilities against a real artifact -------------------------------------------------------


@pytest.mark.parametrize(
    ("components", "argv", "refused"),
    [
        (["text"], ["--spec", "mtp"], "--spec mtp"),
        (["text", "vision"], ["--spec", "mtp", "--draft-tokens", "3"], "--spec mtp"),
        (["text", "mtp"], ["--spec", "dflash"], "--spec dflash"),
        (["text", "mtp"], ["--spec", "dflash2"], "--spec dflash2"),
        (["text", "mtp"], ["--vision"], "--vision"),
        (["text", "mtp"], ["--spec", "mtp", "--vision"], "--vision"),
        (["text", "mtp", "vision"], ["--spec", "mtp"], None),
        # the artifact has what --vision needs; whether the plan runs it is judged at startup
        (["text", "mtp", "vision"], ["--spec", "mtp", "--vision"], None),
        (["text", "vision"], ["--vision", "--media-allow-private"], None),
        (["text", "vision"], ["--media-allow-private"], "--media-allow-private"),
        (["text", "dflash"], ["--spec", "dflash", "--draft-tokens", "7", "--lm-head-draft"], None),
        (["text"], [], None),
    ],
)
def test_capabilities_the_artifact_lacks_are_refused(tmp_path, components, argv, refused):
    path = make_artifact(tmp_path / "m.ninfer", components)
    cfg = parse(str(path), *argv)
    if refused is None:
        artifact = serve.open_artifact(cfg)
        assert artifact.components == components
        return
    with pytest.raises(ConfigError) as e:
        serve.open_artifact(cfg)
    assert refused in str(e.value) and "\n" not in str(e.value)


def test_vision_is_an_engine_option_on_cpu_and_cuda():
    """--vision compiles the tower into the plan (an engine option the protocol layer reads),
    on either executor."""
    cfg = parse("--vision", "--device", "cpu")
    assert cfg.vision and cfg.engine.vision and cfg.engine.compile.vision
    assert not parse("--device", "cpu").vision
    cfg = parse("--vision", cuda=True)
    assert cfg.engine.compile.device == "cuda" and cfg.engine.compile.vision


def test_vision_is_refused_when_the_plan_does_not_run_the_tower():
    # what qwen3_5's IR builder records for a checkpoint whose visual.* weights it cannot run
    declared = {"vision": "declared, not executed"}
    on = ServeConfig(engine=EngineOptions.of(vision=True))
    with pytest.raises(ConfigError) as e:
        check_vision_plan(on, declared)
    assert "--vision" in str(e.value) and "declared, not executed" in str(e.value)
    assert "\n" not in str(e.value)
    check_vision_plan(ServeConfig(), declared)  # text requests on the same artifact
    check_vision_plan(on, {})  # a plan that runs every component


@pytest.fixture
def restore_ninfer_logger():
    """`ninfer serve` configures the "ninfer" and "uvicorn" loggers; undo that afterwards."""
    loggers = [logging.getLogger(name) for name in ("ninfer", "uvicorn")]
    saved = [(lg.handlers[:], lg.level, lg.propagate) for lg in loggers]
    yield
    for lg, (handlers, level, propagate) in zip(loggers, saved):
        lg.handlers[:], lg.level, lg.propagate = handlers, level, propagate


def test_cli_prints_one_line_for_a_missing_component(tmp_path, capsys, restore_ninfer_logger):
    path = make_artifact(tmp_path / "m.ninfer", ["text"])
    code = cli.main(["serve", str(path), "--device", "cpu", "--vision", "--log-level", "off"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("ninfer serve: error: --vision needs the artifact's vision component")
    assert "\n" not in err and "Traceback" not in err


def test_check_capabilities_is_pure():
    check_capabilities(ServeConfig(spec="mtp", draft_tokens=5), ["text", "mtp"])
    with pytest.raises(ConfigError, match="mtp component"):
        check_capabilities(ServeConfig(spec="mtp"), ("text",))


def test_model_id_falls_back_to_metadata_name_then_architecture(tmp_path):
    named = serve.open_artifact(
        parse(str(make_artifact(tmp_path / "a.ninfer", ["text"], "my-model")))
    )
    unnamed = serve.open_artifact(parse(str(make_artifact(tmp_path / "b.ninfer", ["text"], None))))
    assert parse().public_model_id(named.name) == "my-model"
    assert parse().public_model_id(unnamed.name) == "qwen3_5"
    assert parse("--model-id", "alias").public_model_id(named.name) == "alias"


# -- files named by options ---------------------------------------------------------------------


def test_files_named_by_options_are_checked(tmp_path):
    art = make_artifact(tmp_path / "m.ninfer", ["text"])
    serve.check_files(parse(), art)  # nothing named: nothing to check
    with pytest.raises(ConfigError, match="--chat-template .*no such file"):
        serve.check_files(parse("--chat-template", str(tmp_path / "none.jinja")), art)
    bad = tmp_path / "presets.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="--context-cost-presets .*not valid JSON"):
        serve.check_files(parse("--context-cost-presets", str(bad)), art)
    with pytest.raises(ConfigError, match="--context-cost-presets .*cannot read"):
        serve.check_files(parse("--context-cost-presets", str(tmp_path / "none.json")), art)
    with pytest.raises(ConfigError, match="--request-log-jsonl .*does not exist"):
        serve.check_files(parse("--request-log-jsonl", str(tmp_path / "no" / "log.jsonl")), art)
    with pytest.raises(ConfigError, match="over the model artifact"):
        serve.check_files(parse("--request-log-jsonl", str(art)), art)
    good = tmp_path / "ok.json"
    good.write_text(json.dumps({"prefill": []}))
    template = tmp_path / "t.jinja"
    template.write_text("{{ messages }}")
    serve.check_files(
        parse("--context-cost-presets", str(good), "--chat-template", str(template),
              "--request-log-jsonl", str(tmp_path / "log.jsonl")),
        art,
    )  # fmt: skip
