"""--context-cost-presets and the prefill signature, through the startup records of the real
in-process server (tiny trained agent, CPU): the coefficients resolve once at startup from the
generic defaults and the presets file's matching entries (transfer by hardware, prefill by
hardware and prefill signature); the stderr `context cost` record and the request log's
server_start name each part's source; a new representation (another signature) falls back to
the generic prefill coefficients; a malformed file aborts startup naming the member. (The flag
used to be parsed and ignored, and server_start had neither the source nor the signature.)"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ninfer.api.observability.context_cost import GENERIC_PREFILL, GENERIC_TRANSFER
from ninfer.api.observability.request_log import RequestLog
from ninfer.api.observability.server_start import CONTEXT_COST_KEY
from ninfer.api.observability.wiring import Observability
from ninfer.api.server.config import ServeConfig
from ninfer.api.server.state import ServerState
from ninfer.artifact import Artifact
from ninfer.commands import serve
from ninfer.errors import ConfigError
from tests.api.live_app import serve_config


@pytest.fixture(scope="module")
def started(tiny_agent) -> Iterator[tuple[ServerState, Artifact]]:
    config = serve_config(artifact=str(tiny_agent), max_context=512, log_stats_interval_ms=0)
    artifact = Artifact(tiny_agent)
    state = serve.build_state(config, artifact)
    try:
        yield state, artifact
    finally:
        state.engine.close()


def start_record(
    state: ServerState, artifact: Artifact, log_path: Path, caplog, **flags: Any
) -> tuple[dict[str, Any], str]:
    """Start observability (as `ninfer serve` does once the engine is up) with ServeConfig
    `flags`; returns the server_start record and the `context cost` stderr line."""
    server = {k: v for k, v in flags.items() if k in ServeConfig.__dataclass_fields__}
    engine = {k: v for k, v in flags.items() if k not in server}
    if engine:
        compile_kw = dataclasses.replace(state.config.engine.compile, **engine)
        server["engine"] = dataclasses.replace(state.config.engine, compile=compile_kw)
    state.config = dataclasses.replace(state.config, **server)
    state.extra.pop(CONTEXT_COST_KEY, None)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="ninfer.serve"):
        obs = Observability.start(
            state, artifact, request_log=RequestLog.open(log_path, artifact.path)
        )
    obs.close()
    record = json.loads(log_path.read_text().splitlines()[-1])
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("context cost")]
    return record, line


def test_generic_coefficients_and_the_signature_are_recorded(started, tmp_path, caplog):
    state, artifact = started
    record, line = start_record(state, artifact, tmp_path / "a.jsonl", caplog)
    assert record["event"] == "server_start"
    signature = record["artifact"]["prefill_signature"]
    assert re.fullmatch(r"pf1-[0-9a-f]{16}", signature)
    inputs = record["artifact"]["prefill_signature_inputs"]
    assert inputs["text"]["architecture"] == "qwen3" and inputs["uses"] == ["text"]
    assert inputs["bindings"]["prefill_chunk"] == state.config.engine.prefill_chunk
    cost = record["context_cost"]
    assert cost["prefill_signature"] == signature and cost["hardware"].startswith("cpu")
    assert cost["transfer"] == {"source": "generic", **dataclasses.asdict(GENERIC_TRANSFER)}
    assert cost["prefill"] == {"source": "generic", **dataclasses.asdict(GENERIC_PREFILL)}
    assert line == (
        f"context cost: transfer from generic, prefill from generic (hardware "
        f"{cost['hardware']!r}, signature {signature})"
    )


def test_matching_presets_are_selected_and_named(started, tmp_path, caplog):
    state, artifact = started
    base, _ = start_record(state, artifact, tmp_path / "base.jsonl", caplog)
    hardware, signature = base["context_cost"]["hardware"], base["artifact"]["prefill_signature"]
    presets = tmp_path / "presets.json"
    presets.write_text(json.dumps({
        "transfer": [{"hardware": "NVIDIA H200", "host_to_device_gb_per_s": 50, "device_to_host_gb_per_s": 45},
                     {"hardware": hardware, "host_to_device_gb_per_s": 7.5, "device_to_host_gb_per_s": 6.5}],
        "prefill": [{"hardware": hardware, "signature": "pf1-0000000000000000", "ms_per_token": 9,
                     "ms_per_token_squared": 9, "ms_per_chunk": 9},
                    {"hardware": hardware, "signature": signature, "ms_per_token": 0.25,
                     "ms_per_token_squared": 1e-5, "ms_per_chunk": 3}],
    }))  # fmt: skip
    record, line = start_record(
        state, artifact, tmp_path / "b.jsonl", caplog, context_cost_presets=str(presets)
    )
    source = f"file:{presets}"
    assert record["context_cost"]["transfer"] == {
        "source": source, "host_to_device_gb_per_s": 7.5, "device_to_host_gb_per_s": 6.5}  # fmt: skip
    assert record["context_cost"]["prefill"] == {
        "source": source, "ms_per_token": 0.25, "ms_per_token_squared": 1e-5, "ms_per_chunk": 3.0}  # fmt: skip
    assert line.startswith(f"context cost: transfer from {source}, prefill from {source} (")
    # another representation (here: another prefill chunk) has another signature, and no
    # measurement matches it: generic prefill coefficients; the transfer entry still applies
    other, line = start_record(
        state, artifact, tmp_path / "c.jsonl", caplog, context_cost_presets=str(presets),
        prefill_chunk=state.config.engine.prefill_chunk // 2,
    )  # fmt: skip
    assert other["artifact"]["prefill_signature"] != signature
    assert other["context_cost"]["prefill"]["source"] == "generic"
    assert other["context_cost"]["transfer"]["source"] == source
    assert f"transfer from {source}, prefill from generic" in line


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[1]", "expected a JSON object"),
        ('{"transfers": []}', "unknown member 'transfers'"),
        ('{"prefill": {}}', r"prefill: expected an array"),
        ('{"transfer": [{"hardware": "cpu", "host_to_device_gb_per_s": 1}]}',
         r"transfer\[0\]\.device_to_host_gb_per_s: expected a number, got None"),
        (('{"prefill": [{"hardware": "cpu", "signature": "s", "ms_per_token": "fast",'
          ' "ms_per_token_squared": 0, "ms_per_chunk": 0}]}'), r"prefill\[0\]\.ms_per_token: expected a number"),
        ('{"prefill": [{"hardware": "cpu", "ms_per_token": 1, "ms_per_token_squared": 0, "ms_per_chunk": 0}]}',
         r"prefill\[0\]\.signature: expected a non-empty string"),
        ('{"transfer": [{"hardware": "cpu", "host_to_device_gb_per_s": -1, "device_to_host_gb_per_s": 1}]}',
         r"expected a finite number >= 0, got -1"),
        ('{"transfer": [{"hardware": "x", "host_to_device_gb_per_s": 1, "device_to_host_gb_per_s": 1, "pcie": 5}]}',
         r"transfer\[0\]: unknown member 'pcie'"),
        (('{"transfer": [{"hardware": "x", "host_to_device_gb_per_s": 1, "device_to_host_gb_per_s": 1},'
          ' {"hardware": "x", "host_to_device_gb_per_s": 2, "device_to_host_gb_per_s": 2}]}'),
         r"transfer\[1\]: a second entry for hardware 'x'"),
    ],
)  # fmt: skip
def test_a_malformed_presets_file_aborts_startup(tmp_path, tiny_agent, content, message):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    config = ServeConfig(artifact=str(tiny_agent), context_cost_presets=str(bad))
    with pytest.raises(
        ConfigError, match=f"--context-cost-presets {re.escape(str(bad))}: .*{message}"
    ):
        serve.check_files(config, Path(tiny_agent))
