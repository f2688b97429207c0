"""`ninfer serve` options: every flag of docs/serving.md's "Server options", its default and its
validation (capabilities against a real artifact: test_serve_capabilities.py; the listening
socket: test_serve_socket.py)."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from ninfer import cli
from ninfer.api.server.config import ServeConfig
from ninfer.commands import serve
from ninfer.errors import ConfigError
from ninfer.passes.options import CompileOptions
from ninfer.runtime.config import EngineOptions
from tests.api.serve_helpers import parse


def help_text() -> str:
    p = argparse.ArgumentParser(prog="ninfer serve")
    serve.add_arguments(p)
    return p.format_help()


# The "Server options" table of docs/serving.md: flag -> (ServeConfig field path, executable default).
SPEC_DEFAULTS = {
    "--host": ("host", "127.0.0.1"),
    "--port": ("port", 8080),
    "--api-key": ("api_key", None),
    "--model-id": ("model_id", None),
    "--max-context": ("engine.compile.max_context", 8192),
    "--kv-capacity": ("engine.compile.kv_capacity", None),  # follows --max-context
    "--max-concurrency": ("engine.compile.max_concurrency", 1),
    "--max-pending-requests": ("engine.max_pending_requests", 16),
    "--pending-timeout-ms": ("engine.pending_timeout_ms", 30000),
    "--prefill-chunk": ("engine.compile.prefill_chunk", 1024),
    "--log-stats-interval-ms": ("log_stats_interval_ms", 5000),
    "--log-level": ("log_level", "info"),
    "--device": ("engine.device", "cpu"),  # CUDA device 0 when available; this test says it is not
    "--context-cost-presets": ("context_cost_presets", None),
    "--max-request-mib": ("max_request_mib", 384),
    "--media-cache-mib": ("media_cache_mib", 1024),
    "--media-live-mib": ("media_live_mib", 2048),
    "--media-preprocess-threads": ("media_preprocess_threads", 0),
    "--media-allow-private": ("media_allow_private", False),
    "--request-log-jsonl": ("request_log_jsonl", None),
    "--response-store-max-records": ("response_store_max_records", 1024),
    "--response-store-max-mib": ("response_store_max_mib", 256),
    "--kv-dtype": ("engine.compile.kv_dtype", None),  # bf16 on cuda, the compute dtype on cpu
    "--spec": ("spec", None),
    "--draft-tokens": ("draft_tokens", None),
    "--lm-head-draft": ("lm_head_draft", False),
    "--default-max-tokens": ("engine.default_max_tokens", 8192),
    "--default-thinking-budget": ("default_thinking_budget", None),
    "--vision": ("vision", False),
    "--no-cuda-graph": ("engine.compile.cuda_graphs", True),
    "--no-prefix-reuse": ("engine.prefix_reuse", True),
    "--device-state-slots": ("engine.compile.device_state_slots", None),
    "--tensor-parallel": ("engine.compile.tensor_parallel", 1),
    "--host-context-mib": ("engine.host_context_mib", None),
    "--no-thinking": ("thinking", True),
    "--preserve-thinking": ("preserve_thinking", False),
    "--cors": ("cors", False),
    "--temperature": ("temperature", None),
    "--top-p": ("top_p", None),
    "--top-k": ("top_k", None),
    "--min-p": ("min_p", None),
    "--presence-penalty": ("presence_penalty", None),
    "--frequency-penalty": ("frequency_penalty", None),
    "--seed": ("seed", None),
    "--greedy": ("greedy", False),
    "--chat-template": ("chat_template", None),
    "--dtype": ("engine.compile.dtype", "float32"),  # float32 on cpu
}


def field(cfg: ServeConfig, path: str) -> object:
    """The value at a dotted field path ("engine.compile.max_context")."""
    for name in path.split("."):
        cfg = getattr(cfg, name)
    return cfg


def test_every_spec_option_has_its_default():
    cfg = parse()
    for flag, (name, default) in SPEC_DEFAULTS.items():
        assert field(cfg, name) == default, flag
    assert cfg.artifact is None  # the demo model


def test_help_documents_every_option():
    text = help_text()
    for flag in SPEC_DEFAULTS:
        assert flag in text, flag
    assert "ARTIFACT" in text and "demo model" in text


def test_help_through_the_cli_exits_zero(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["serve", "--help"])
    assert e.value.code == 0
    assert "--max-concurrency" in capsys.readouterr().out


def test_every_flag_reaches_the_config():
    cfg = parse(
        "m.ninfer", "--host", "0.0.0.0", "--port", "9000", "--api-key", "k", "--model-id", "alias",
        "--max-context", "4096", "--kv-capacity", "auto", "--max-concurrency", "8",
        "--max-pending-requests", "0", "--pending-timeout-ms", "5", "--prefill-chunk", "64",
        "--log-stats-interval-ms", "0", "--log-level", "off", "--device", "1",
        "--context-cost-presets", "p.json", "--max-request-mib", "1", "--media-cache-mib", "0",
        "--media-live-mib", "8", "--media-preprocess-threads", "3", "--request-log-jsonl", "r.jsonl",
        "--response-store-max-records", "2", "--response-store-max-mib", "3", "--kv-dtype", "k8v4",
        "--spec", "dflash2", "--draft-tokens", "15", "--lm-head-draft", "--default-max-tokens", "7",
        "--default-thinking-budget", "512", "--no-cuda-graph", "--no-prefix-reuse",
        "--device-state-slots", "0", "--host-context-mib", "0", "--no-thinking", "--preserve-thinking",
        "--cors", "--temperature", "0.5", "--top-p", "0.9", "--top-k", "0", "--min-p", "0.1",
        "--presence-penalty", "-2", "--frequency-penalty", "2", "--seed", "-7", "--greedy",
        "--chat-template", "t.jinja", "--dtype", "float32", "--tensor-parallel", "2",
        cuda=True,
    )  # fmt: skip
    engine = EngineOptions(
        compile=CompileOptions(
            device="cuda",
            dtype="float32",
            kv_dtype="k8v4",
            max_concurrency=8,
            max_context=4096,
            kv_capacity="auto",
            prefill_chunk=64,
            device_state_slots=0,
            cuda_graphs=False,
            tensor_parallel=2,
        ),
        device_index=1,
        max_pending_requests=0,
        pending_timeout_ms=5,
        prefix_reuse=False,
        default_max_tokens=7,
        host_context_mib=0,
    )
    assert cfg == ServeConfig(
        artifact="m.ninfer", host="0.0.0.0", port=9000, api_key="k", model_id="alias",
        engine=engine, log_stats_interval_ms=0, log_level="off",
        context_cost_presets="p.json", max_request_mib=1, media_cache_mib=0,
        media_live_mib=8, media_preprocess_threads=3, request_log_jsonl="r.jsonl",
        response_store_max_records=2, response_store_max_mib=3, spec="dflash2",
        draft_tokens=15, lm_head_draft=True, default_thinking_budget=512,
        thinking=False, preserve_thinking=True, cors=True, temperature=0.5, top_p=0.9, top_k=0,
        min_p=0.1, presence_penalty=-2.0, frequency_penalty=2.0, seed=-7, greedy=True,
        chat_template="t.jinja",
    )  # fmt: skip
    assert cfg.engine.device == "cuda:1"
    assert cfg.max_request_bytes == 1 << 20
    assert cfg.public_model_id("artifact-name") == "alias"
    assert parse().public_model_id("artifact-name") == "artifact-name"


def test_the_engine_flags_make_the_engine_options():
    """The engine's flags land in `ServeConfig.engine`, the EngineOptions that build_engine
    takes (its compile options included), and nowhere else."""
    opts = parse("--max-concurrency", "4", "--kv-capacity", "auto", "--kv-dtype", "fp8",
                 "--no-cuda-graph", "--device-state-slots", "2", "--prefill-chunk", "128",
                 "--max-context", "512", "--no-prefix-reuse").engine  # fmt: skip
    c = opts.compile
    assert (c.device, c.dtype, c.kv_dtype, c.max_concurrency) == ("cpu", "float32", "fp8", 4)
    assert (c.kv_capacity, c.cuda_graphs, c.device_state_slots, c.prefill_chunk) == (
        "auto",
        False,
        2,
        128,
    )
    assert (opts.max_context, opts.prefix_reuse, opts.device) == (512, False, "cpu")
    assert parse("--kv-capacity", "4096").engine.compile.kv_capacity == 4096
    gpu = parse("--device", "1", cuda=True).engine
    assert (gpu.compile.device, gpu.compile.dtype, gpu.compile.kv_dtype) == (
        "cuda",
        "bfloat16",
        None,
    )
    assert gpu.device == "cuda:1"
    assert not {f.name for f in dataclasses.fields(ServeConfig)} & {
        f.name for f in dataclasses.fields(CompileOptions)
    }  # no engine flag is read twice


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--max-concurrency", "0"], "--max-concurrency"),
        (["--max-concurrency", "9"], "--max-concurrency"),
        (["--port", "70000"], "--port"),
        (["--max-context", "0"], "--max-context"),
        (["--kv-capacity", "0"], "--kv-capacity"),
        (["--max-pending-requests", "-1"], "--max-pending-requests"),
        (["--pending-timeout-ms", "0"], "--pending-timeout-ms"),
        (["--prefill-chunk", "0"], "--prefill-chunk"),
        (["--log-stats-interval-ms", "-1"], "--log-stats-interval-ms"),
        (["--max-request-mib", "0"], "--max-request-mib"),
        (["--client-timeout-s", "0"], "--client-timeout-s"),
        (["--client-timeout-s", "nan"], "--client-timeout-s"),
        (["--media-cache-mib", "-1"], "--media-cache-mib"),
        (["--media-live-mib", "0"], "--media-live-mib"),
        (["--media-preprocess-threads", "-1"], "--media-preprocess-threads"),
        (["--response-store-max-records", "-1"], "--response-store-max-records"),
        (["--default-max-tokens", "0"], "--default-max-tokens"),
        (["--default-thinking-budget", "0"], "--default-thinking-budget"),
        (["--device-state-slots", "-1"], "--device-state-slots"),
        (["--tensor-parallel", "0"], "--tensor-parallel must be in 1..64, got 0"),
        (["--tensor-parallel", "6"], "--tensor-parallel must be a power of two"),
        (["--host-context-mib", "-1"], "--host-context-mib"),
        (["--draft-tokens", "3"], "--draft-tokens"),  # requires --spec
        (["--spec", "mtp", "--draft-tokens", "6"], "--draft-tokens"),
        (["--spec", "mtp", "--draft-tokens", "0"], "--draft-tokens"),
        (["--spec", "dflash", "--draft-tokens", "16"], "--draft-tokens"),
        (["--spec", "dflash2", "--draft-tokens", "16"], "--draft-tokens"),
        (["--lm-head-draft"], "--lm-head-draft"),  # requires --spec
        (["--temperature", "-0.1"], "--temperature"),
        (["--temperature", "nan"], "--temperature"),
        (["--top-p", "-0.1"], "--top-p must be a number in [0, 1]"),
        (["--top-p", "1.5"], "--top-p must be a number in [0, 1]"),  # a request's range
        (["--seed", str(1 << 63)], "--seed must be a signed 64-bit integer"),
        (["--top-k", "21"], "--top-k"),
        (["--top-k", "-1"], "--top-k"),
        (["--min-p", "1.5"], "--min-p"),
        (["--presence-penalty", "3"], "--presence-penalty"),
        (["--frequency-penalty", "-3"], "--frequency-penalty"),
        (["--api-key", ""], "--api-key"),
        (["--model-id", " "], "--model-id"),
        (["--device", "tpu"], "--device"),
    ],
)
def test_invalid_values_name_the_flag(argv, flag):
    with pytest.raises(ConfigError) as e:
        parse(*argv)
    message = str(e.value)
    assert flag in message and "\n" not in message


@pytest.mark.parametrize(
    ("argv", "path", "value"),
    [
        (["--spec", "mtp", "--draft-tokens", "5"], "draft_tokens", 5),
        (["--spec", "mtp", "--draft-tokens", "1"], "draft_tokens", 1),
        (["--spec", "dflash", "--draft-tokens", "15"], "draft_tokens", 15),
        (["--spec", "dflash", "--lm-head-draft"], "lm_head_draft", True),
        (["--spec", "mtp"], "draft_tokens", None),
        (["--top-k", "20"], "top_k", 20),
        (["--seed", str(-(1 << 63))], "seed", -(1 << 63)),
        (["--max-concurrency", "8"], "engine.compile.max_concurrency", 8),
        (["--kv-dtype", "nvfp4"], "engine.compile.kv_dtype", "nvfp4"),
        (["--log-level", "trace"], "log_level", "trace"),
        (["--client-timeout-s", "2.5"], "client_timeout_s", 2.5),
        ([], "client_timeout_s", 30.0),
    ],
)
def test_boundary_values_are_accepted(argv, path, value):
    assert field(parse(*argv), path) == value


@pytest.mark.parametrize("argv", [["--kv-dtype", "fp16"], ["--spec", "eagle"], ["--log-level", "verbose"],
                                  ["--dtype", "float16"], ["--kv-capacity", "lots"], ["--port", "x"]])  # fmt: skip
def test_argparse_refuses_unknown_choices(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["serve", *argv])
    assert e.value.code == 2
    assert argv[0] in capsys.readouterr().err


def test_device_and_dtype_resolution():
    def device_dtype(cfg):
        return cfg.engine.device, cfg.engine.compile.dtype

    assert device_dtype(parse(cuda=True)) == ("cuda:0", "bfloat16")
    assert device_dtype(parse(cuda=False)) == ("cpu", "float32")
    cfg = parse("--device", "3", cuda=True)
    assert (cfg.engine.compile.device, cfg.engine.device_index) == ("cuda", 3)
    assert (parse().engine.compile.device, parse().engine.device_index) == ("cpu", None)
    assert parse("--device", "cpu", cuda=True).engine.device == "cpu"
    assert parse("--device", "cuda", cuda=True).engine.device == "cuda:0"
    assert (
        device_dtype(parse("--device", "cuda:2", "--dtype", "float32", cuda=True))[1] == "float32"
    )
    with pytest.raises(ConfigError, match="--device 0: CUDA is not available"):
        parse("--device", "0", cuda=False)


def test_abbreviated_flags_are_refused(capsys):
    """argparse would take `--api-ke` for --api-key, a spelling the request log's redaction of
    the key does not know: the CLI accepts flags only as written."""
    from ninfer.cli import main

    with pytest.raises(SystemExit) as e:
        main(["serve", "--api-ke", "secret", "--port", "0"])
    assert e.value.code == 2 and "unrecognized arguments: --api-ke" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (("--vision", "--device", "cpu", "--tensor-parallel", "2"), "--vision"),
        (
            ("--spec", "draft", "--draft-model", "d.ninfer", "--tensor-parallel", "2"),
            "--spec draft",
        ),
    ],
)
def test_tensor_parallel_refuses_what_it_does_not_shard(argv, flag):
    """The vision tower and speculative rounds do not run on sharded engines yet: one line at
    startup, not a failure at the first request."""
    with pytest.raises(ConfigError) as e:
        parse(*argv)
    assert flag in str(e.value) and "--tensor-parallel" in str(e.value)
    assert "\n" not in str(e.value)
