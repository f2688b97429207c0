"""--request-log-jsonl FILE: the machine-readable measurement log (docs/serving.md, "Request
log and stderr records"; the schema is documented in docs/request-log.md).

One JSON object per line, appended and flushed per event, every one carrying

    {"schema": "ninfer_serve_request_log", "schema_version": 24, "event": ...,
     "timestamp_unix_ms": ..., "server_instance_id": ..., ...}

Events: server_start, request_start, request_rejected, request_scheduling, request_done,
request_error, throughput. Seconds are unrounded floats. A started request gets exactly one
terminal (request_done or request_error; ninfer.api.service.observe guarantees it). Nothing here writes
a prompt, generated text, a stop string, tool arguments or the API key (argv shows <redacted>).
Writes come from the HTTP event loop and the throughput reporter thread; a lock keeps lines whole.
The server_start record's fields are built in ninfer.api.observability.server_start.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import IO, Any

from ninfer.api.service.generation import Finished
from ninfer.api.service.observe import RequestRecord, Sink
from ninfer.api.wire.errors import ApiError
from ninfer.errors import ConfigError
from ninfer.runtime.request import FIRST_OUTPUT_PARTS

SCHEMA = "ninfer_serve_request_log"
SCHEMA_VERSION = 24  # docs/request-log.md: schema_version 24
HOST_PHASES = (
    "engine_boundary",
    "program_submit",
    "program_post",
    "engine_commit_output",
    "engine_maintenance",
)
REDACTED = "<redacted>"
SECRET_FLAGS = ("--api-key",)

log = logging.getLogger("ninfer.serve")


def redact_argv(argv: list[str]) -> list[str]:
    """argv with the value of every secret flag (`--api-key KEY`, `--api-key=KEY`) replaced."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
        elif arg in SECRET_FLAGS:
            out.append(arg)
            hide_next = True
        elif any(arg.startswith(flag + "=") for flag in SECRET_FLAGS):
            out.append(arg.split("=", 1)[0] + "=" + REDACTED)
        else:
            out.append(arg)
    return out


class RequestLog:
    """An open JSONL log. `write()` is thread-safe; each call appends one flushed line."""

    def __init__(self, file: IO[str], path: Path) -> None:
        self.path = path
        self.server_instance_id = uuid.uuid4().hex
        self._file = file
        self._lock = threading.Lock()
        self._failed = False

    @classmethod
    def open(
        cls, path: str | os.PathLike[str], artifact_path: str | os.PathLike[str] | None = None
    ) -> RequestLog:
        """Open `path` for appending. Raises ConfigError (one line) when it cannot be opened,
        when its directory does not exist, or when it resolves to the model artifact."""
        p = Path(path)
        if artifact_path is not None and p.resolve() == Path(artifact_path).resolve():
            raise ConfigError(f"--request-log-jsonl {p}: refuses to write over the model artifact")
        try:
            file = open(p, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()
        except OSError as e:
            raise ConfigError(
                f"--request-log-jsonl {p}: cannot open for appending ({e.strerror})"
            ) from None
        return cls(file, p)

    def write(self, event: str, fields: dict[str, Any]) -> None:
        """Append one `event` record; I/O failures are reported once on stderr, not raised."""
        record = {
            "schema": SCHEMA,
            "schema_version": SCHEMA_VERSION,
            "event": event,
            "timestamp_unix_ms": int(time.time() * 1000),
            "server_instance_id": self.server_instance_id,
            **fields,
        }
        line = (
            json.dumps(record, ensure_ascii=False, separators=(",", ":"), default=_jsonable) + "\n"
        )
        with self._lock:
            if self._file.closed:
                return
            try:
                self._file.write(line)
                self._file.flush()
            except OSError as e:
                if not self._failed:
                    self._failed = True
                    log.error(
                        "request log %s: write failed (%s); later records may be lost",
                        self.path,
                        e.strerror,
                    )

    def close(self) -> None:
        with self._lock:
            self._file.close()


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


# -- request events ----------------------------------------------------------------------------


class RequestLogSink(Sink):
    """Writes the request events of ninfer.api.service.observe to `log`.

    `default_thinking_budget`: --default-thinking-budget, inherited by thinking-mode requests.
    """

    def __init__(self, log: RequestLog, *, default_thinking_budget: int | None = None) -> None:
        self.log = log
        self.default_thinking_budget = default_thinking_budget

    def request_start(self, rec: RequestRecord) -> None:
        self.log.write("request_start", {
            **_identity(rec),
            **_options(rec),
            "responses_semantic_change": rec.request.semantic_change if rec.protocol == "responses" else None,
            "request_shape": _shape(rec),
            "media_items": _media_items(rec),
            "media": _media(rec),
            "prompt_tokens": rec.prompt_tokens,
            "enable_thinking": rec.starts_in_thinking,
            "thinking_budget": self._thinking_budget(rec),
            "sampling": _sampling(rec),
            "output_budget": _output_budget(rec),
            "checkpoint_positions": list(rec.engine_request.checkpoint_positions) if rec.engine_request else [],
            "timings_seconds": {"prepare": rec.prepare_s, "tokenizer": rec.prepare_s},
        })  # fmt: skip

    def request_rejected(self, rec: RequestRecord, err: ApiError) -> None:
        self.log.write("request_rejected", {
            **_identity(rec),
            **_options(rec),
            "request_shape": _shape(rec),
            "media_items": _media_items(rec),
            "phase": "prepare",
            "outcome": rec.outcome,
            "error": _error(err),
            "timings_seconds": {"prepare": rec.total_s, "total": rec.total_s},
        })  # fmt: skip

    def request_scheduling(self, rec: RequestRecord, event: Any) -> None:
        self.log.write("request_scheduling", {
            **_identity(rec),
            "boundary": event.boundary,
            "preemption_index": event.preemption_index,
            "route": event.route,
            "steady_ns": event.steady_ns,
            "elapsed_ns": event.elapsed_ns,
            "progress": event.progress,
        })  # fmt: skip

    def request_done(
        self, rec: RequestRecord, finished: Finished | None, err: ApiError | None
    ) -> None:
        ev = rec.engine
        usage = ev.usage if ev is not None else None
        t = ev.timings if ev is not None else None
        cached = usage.cached_tokens if usage is not None else 0
        self.log.write("request_done", {
            **_identity(rec),
            "finish_reason": _finish_reason(finished, err, ev),
            "engine_finish_reason": ev.reason if ev is not None else None,
            "outcome": rec.outcome,
            "usage": {
                "prompt_tokens": usage.prompt_tokens if usage else rec.prompt_tokens,
                "completion_tokens": finished.usage.completion_tokens if finished else 0,
                "cached_tokens": cached,
                "reasoning_tokens": finished.usage.reasoning_tokens if finished else 0,
            },
            "prefix_cache_hit_tokens": cached,
            "prefix_reuse_path": usage.reuse_path if usage is not None else "root",
            "computed_prefill_tokens": usage.prefill_tokens if usage is not None else 0,
            "result": {
                "generated_token_ids": list(finished.generated_token_ids) if finished else [],
                "tool_call_parse": dict(finished.tool_parse) if finished else {},
                "tool_calls": len(finished.tool_calls) if finished else 0,
                "stop_sequence_matched": finished is not None and finished.stop_sequence is not None,
                "length_cause": finished.length_cause if finished else None,
            },
            "generation": {"scheduling": {
                "preemptions": usage.preemptions if usage else 0,
                "snapshot_restores": usage.snapshot_restores if usage else 0,
                "replay_restores": usage.replay_restores if usage else 0,
                "replayed_tokens": usage.replayed_tokens if usage else 0,
                "paused_seconds": t.paused_s if t else 0.0,
                "transfer_bytes": sum(v["bytes"] for v in (getattr(t, "transfers", None) or {}).values()),
            }},
            "timings_seconds": {
                "prepare": rec.prepare_s,
                "queue": rec.queue_s,
                "ttft": rec.ttft_s,
                "vision": 0.0,
                "prefill": t.prefill_s if t else None,
                "decode": t.decode_s if t else None,
                "total": rec.total_s,
            },
            "thinking_budget": _thinking_counters(rec, usage),
            "engine_timing": _engine_timing(t),
            "first_output_timing": _first_output_timing(t),
            "work": {"gpu_seconds": getattr(t, "prefill_gpu_s", None) if t else None},
            "context_transfers": dict(getattr(t, "transfers", None) or {}) if t else {},
            "speculative": (t.speculative if t and getattr(t, "speculative", None) else
                            {"backend": None, "draft_window": 0, "rounds": 0, "drafted_tokens": 0,
                             "accepted_tokens": 0, "fallback_steps": 0,
                             "accepted_per_position": []}),
            "error": _error(err) if err is not None else _engine_error(finished),
        })  # fmt: skip

    def request_error(self, rec: RequestRecord, kind: str, detail: str) -> None:
        self.log.write("request_error", {
            **_identity(rec),
            **_options(rec),
            "kind": kind,
            "outcome": rec.outcome,
            "message": detail,
            "prompt_tokens": rec.prompt_tokens,
            "first_token_seen": rec.first_token_s is not None,
            "sampling": _sampling(rec),
            "output_budget": _output_budget(rec),
            "timings_seconds": {"prepare": rec.prepare_s, "ttft": rec.ttft_s, "total": rec.total_s},
        })  # fmt: skip

    def _thinking_budget(self, rec: RequestRecord) -> int | None:
        if rec.request.thinking_budget is not None:
            return rec.request.thinking_budget
        return self.default_thinking_budget if rec.starts_in_thinking else None


def _finish_reason(finished: Finished | None, err: ApiError | None, ev: Any) -> str:
    if finished is not None:
        return finished.reason
    return ev.reason if err is None and ev is not None else "error"


def _identity(rec: RequestRecord) -> dict[str, Any]:
    return {
        "request_id": rec.request_id,
        "http_request_id": rec.http_request_id,
        "protocol": rec.protocol,
    }


def _options(rec: RequestRecord) -> dict[str, Any]:
    opts = rec.request.template_options
    return {
        "requested_reasoning_effort": opts.requested_reasoning_effort,
        "preserve_thinking": opts.requested_preserve_thinking,
    }


def _media_items(rec: RequestRecord) -> int:
    """Media parts (images, videos) of the request's messages: list items that are not text."""
    return sum(
        1
        for m in rec.request.messages
        if isinstance(m.get("content"), list)
        for it in m["content"]
        if isinstance(it, dict) and it.get("type") != "text"
    )


def _media(rec: RequestRecord) -> dict[str, Any]:
    """Request-scoped media acquisition / preprocessing / cache / payload fields, measured for
    this request's own items (ninfer.media.preparer.request_log_fields): zeros without media.

    items, images, videos; acquisition_seconds (fetching / decoding the sources);
    preprocess_wall_seconds, preprocess_work_seconds (wall time to usable payloads, worker time
    of this request's own builds); cache_hits, cache_misses, single_flight_waits; source_bytes,
    payload_bytes; vision_tokens (merged tokens placed in the prompt)."""
    m = rec.media or {}
    return {
        "items": m.get("media_items", 0),
        "images": m.get("media_images", 0),
        "videos": m.get("media_videos", 0),
        "acquisition_seconds": m.get("media_acquire_seconds", 0.0),
        "preprocess_wall_seconds": m.get("media_prepare_wall_seconds", 0.0),
        "preprocess_work_seconds": m.get("media_prepare_work_seconds", 0.0),
        "cache_hits": m.get("media_cache_hits", 0),
        "cache_misses": m.get("media_cache_misses", 0),
        "single_flight_waits": m.get("media_single_flight_joins", 0),
        "source_bytes": m.get("media_source_bytes", 0),
        "payload_bytes": m.get("media_payload_bytes", 0),
        "vision_tokens": m.get("vision_tokens", 0),
    }


def _thinking_counters(rec: RequestRecord, usage: Any) -> dict[str, Any]:
    """How the thinking budget applied: output tokens counted against it, whether it was reached
    with the block open, and the closing-suffix tokens the engine committed unsampled."""
    r = rec.engine_request
    budget = r.thinking_budget if r is not None else None
    used = getattr(usage, "thinking_tokens", 0) if usage is not None else 0
    forced = getattr(usage, "thinking_forced_tokens", 0) if usage is not None else 0
    return {
        "budget": budget,
        "thinking_tokens": used,
        "budget_reached": budget is not None and used >= budget,
        "forced_close": forced > 0,
        "injected_tokens": forced,
    }


def _engine_timing(t: Any) -> dict[str, Any]:
    """request_done.engine_timing: FIFO queue wait, pauses, and the engine worker time the
    request was exposed to from initial admission to its finish (ninfer.runtime.host_work):
    five mutually exclusive host phases with their exact `total`, device wait apart, the
    decode-class share with its round count, and the request's prefill / control unit counts.
    Shared by every request of a batch: never sum across requests."""
    units = getattr(t, "units", None) or {}
    return {
        "queue_wait_seconds": t.queue_s if t else None,
        "paused_seconds": t.paused_s if t else 0.0,
        "engine_total_seconds": t.total_s if t else None,
        **_exposure(getattr(t, "exposure", None) if t is not None else None, units),
        "units": _units(units) if t is not None else None,
    }


def _exposure(exp: dict[str, Any] | None, units: dict[str, int]) -> dict[str, Any]:
    """Worker exposure (ninfer.runtime.host_work.HostWork.exposure_since) as logged: device
    wait, the five host phases and their exact total, and the decode-class share."""
    host = {p: exp["host"].get(p, 0.0) for p in HOST_PHASES} if exp else None
    return {
        "device_wait_exposed_seconds": exp["device_wait"] if exp else None,
        "host_exposed_seconds": {**host, "total": sum(host.values())} if host else None,
        "decode": {
            "host_exposed_seconds": exp["decode_host"],
            "device_wait_exposed_seconds": exp["decode_device_wait"],
            "rounds": units.get("decode_rounds", 0),
        }
        if exp
        else None,
    }


def _units(units: dict[str, int]) -> dict[str, int]:
    """A request's unit counts: prefill-class chunks (replay among them) and control
    operations (snapshot saves and restores)."""
    return {k: units.get(k, 0) for k in ("prefill", "replay", "control")}


def _first_output_timing(t: Any) -> dict[str, Any] | None:
    """request_done.first_output_timing: observations frozen right before the engine
    published the request's first output tokens; null without output."""
    f = getattr(t, "first_output", None) if t is not None else None
    if f is None:
        return None
    units = f["units"]
    return {
        "engine_elapsed_seconds": f["engine_elapsed_seconds"],
        **{k: f[k] for k in FIRST_OUTPUT_PARTS},
        "engine": _exposure(f["exposure"], units),
        "prefill": {"tokens": f["prefill_tokens"], "units": units["prefill"] - units["replay"]},
        "replay": {"tokens": f["replayed_tokens"], "units": units["replay"]},
        "control_units": units["control"],
    }


def _shape(rec: RequestRecord) -> dict[str, Any]:
    """Counts only: never message content, tool schemas or stop strings."""
    req = rec.request
    roles = Counter(str(m.get("role")) for m in req.messages)
    return {
        "stream": req.stream,
        "messages": len(req.messages),
        "roles": dict(sorted(roles.items())),
        "tools": len(req.tools or []),
        "parse_tools": req.parse_tools,
        "continue_final_message": req.continue_final_message,
        "stop_sequences": len(req.stop),
        "cache_points": len(req.cache_points),
        "session_chained": req.session_key is not None,
        "requested_max_tokens": req.max_tokens,
    }


def _sampling(rec: RequestRecord) -> dict[str, Any] | None:
    if rec.engine_request is None:
        return None
    s = rec.engine_request.sampling
    return {
        "temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k, "min_p": s.min_p,
        "presence_penalty": s.presence_penalty, "frequency_penalty": s.frequency_penalty,
        "seed": s.seed, "greedy": s.greedy,
    }  # fmt: skip


def _output_budget(rec: RequestRecord) -> dict[str, Any]:
    r = rec.engine_request
    effective = None if r is None else 0 if r.prompt_only else r.sampling.max_tokens
    return {"requested": rec.request.max_tokens, "effective": effective}


def _error(err: ApiError) -> dict[str, Any]:
    return {
        "status": err.status,
        "type": err.type,
        "code": err.code,
        "param": err.param,
        "message": err.message,
    }


def _engine_error(finished: Finished | None) -> dict[str, Any] | None:
    if finished is None or finished.error is None:
        return None
    e = finished.error
    return {
        "status": None,
        "type": type(e).__name__,
        "code": None,
        "param": None,
        "message": str(e),
    }
