"""Operational records on stderr: `YYYY-MM-DD HH:MM:SS.mmm LEVEL message`.

`configure_stderr(level)` installs the format for ninfer's and uvicorn's loggers at --log-level
(trace|debug|info|warning|error|critical|off). Records are single lines with no terminal control
sequences: control characters in a message are escaped (`\\x1b` is written as the four
characters `\\x1b`), so redirected stderr is plain text. Exception tracebacks keep their lines.

`OpLogSink` writes the request lifecycle: one completion record per started request (tokens,
`cache N (P%, path)`, rounded rates), one line per rejection or failure (HTTP status and code,
never the message, which may quote the client), and one warning when tool-call markup fell back
to text (its classification only). Records never contain prompts, generated text, request
bodies or credentials; the JSONL request log holds the full-precision fields.
"""

from __future__ import annotations

import logging
import re
import sys
from typing import TextIO

from ninfer.api.service.generation import Finished
from ninfer.api.service.observe import RequestRecord, Sink
from ninfer.api.wire.errors import ApiError

TRACE = 5
LEVELS = {
    "trace": TRACE, "debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
    "error": logging.ERROR, "critical": logging.CRITICAL, "off": logging.CRITICAL + 10,
}  # fmt: skip
LOGGERS = ("ninfer", "uvicorn")
REUSE_LABELS = {"root": "root prefill", "checkpoint": "retained prefix"}

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_CONTROL_KEEP_NEWLINES = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")

log = logging.getLogger("ninfer.requests")


def _escape(match: re.Match[str]) -> str:
    return f"\\x{ord(match.group()):02x}"


class OperationalFormatter(logging.Formatter):
    """`2026-01-31 12:00:00.123 INFO message`, message escaped to one line."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s.%(msecs)03d %(levelname)s %(message)s", "%Y-%m-%d %H:%M:%S")

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = _CONTROL.sub(_escape, record.message)
        return super().formatMessage(record)

    def formatException(self, ei: object) -> str:
        return _CONTROL_KEEP_NEWLINES.sub(_escape, super().formatException(ei))  # type: ignore[arg-type]

    def formatStack(self, stack_info: str) -> str:
        return _CONTROL_KEEP_NEWLINES.sub(_escape, stack_info)


def configure_stderr(level: str, stream: TextIO | None = None) -> logging.Handler:
    """Route ninfer's and uvicorn's records to `stream` (stderr) at `level`; returns the handler."""
    logging.addLevelName(TRACE, "TRACE")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(OperationalFormatter())
    for name in LOGGERS:
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(LEVELS[level])
        logger.propagate = False
    return handler


# -- readable values ---------------------------------------------------------------------------


def count(n: float) -> str:
    """1234 -> '1,234'."""
    return f"{round(n):,}"


def rate(x: float) -> str:
    """A rounded per-second rate: 3 significant digits, thousands separated."""
    if x >= 100:
        return f"{x:,.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def seconds(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 1.0:
        return f"{s * 1000:.0f} ms"
    if s < 100.0:
        return f"{s:.2f} s"
    return f"{s:,.0f} s"


def per_second(n: float, s: float | None) -> float:
    return n / s if s and s > 0 and n > 0 else 0.0


# -- request lifecycle -------------------------------------------------------------------------


class OpLogSink(Sink):
    """Request lifecycle records on the `ninfer.requests` logger."""

    def request_start(self, rec: RequestRecord) -> None:
        if log.isEnabledFor(logging.DEBUG):
            budget = rec.engine_request.sampling.max_tokens if rec.engine_request else None
            log.debug("%s started: %s prompt tokens, up to %s output tokens, prepared in %s",
                      _name(rec), count(rec.prompt_tokens or 0), count(budget or 0), seconds(rec.prepare_s))  # fmt: skip

    def request_rejected(self, rec: RequestRecord, err: ApiError) -> None:
        if rec.outcome == "cancelled":
            log.info("%s cancelled: the client left during preparation", _name(rec))
            return
        log.info("%s rejected: %d %s", _name(rec), err.status, err.code or err.type)

    def request_done(
        self, rec: RequestRecord, finished: Finished | None, err: ApiError | None
    ) -> None:
        if finished is None and err is None:
            reason = rec.engine.reason if rec.engine is not None else "error"
            log.info("%s %s, but the client left before the response completed", _name(rec), reason)
            return
        if finished is None:
            code = err.code if err is not None else "error"
            level = logging.WARNING if rec.outcome == "timeout" else logging.ERROR
            log.log(
                level,
                "%s failed: %s %s after %s",
                _name(rec),
                err.status if err else 500,
                code,
                seconds(rec.total_s),
            )
            return
        if (
            finished.reason == "error"
            and getattr(finished.error, "code", None) == "server_shutting_down"
        ):
            log.warning(
                "%s ended by the server's shutdown after %s", _name(rec), seconds(rec.total_s)
            )
            return
        if finished.reason == "error":
            log.error("%s failed during generation: %s after %s", _name(rec),
                      type(finished.error).__name__ if finished.error else "error", seconds(rec.total_s))  # fmt: skip
            return
        log.info("%s", completion_message(rec, finished))
        reason = (
            finished.tool_parse.get("fallback_reason", "none") if finished.tool_parse else "none"
        )
        if reason != "none":
            log.warning("%s: tool-call markup was returned as text (%s)", _name(rec), reason)

    def request_error(self, rec: RequestRecord, kind: str, detail: str) -> None:
        if kind == "cancelled":
            seen = "first token seen" if rec.first_token_s is not None else "before its first token"
            log.info(
                "%s cancelled by the client after %s (%s)", _name(rec), seconds(rec.total_s), seen
            )
        else:  # the class only: an exception message may quote request data
            log.error(
                "%s failed: %s after %s", _name(rec), detail.split(":", 1)[0], seconds(rec.total_s)
            )

    def response_failed(self, rec: RequestRecord, kind: str) -> None:
        log.warning("%s: the response failed after the outcome (%s)", _name(rec), kind)


def _name(rec: RequestRecord) -> str:
    return f"request {rec.request_id} {rec.protocol}"


def completion_message(rec: RequestRecord, finished: Finished) -> str:
    """`request 7 chat stop: 13 prompt + 35 output tokens, cache 0 (0%, root prefill), ...`."""
    u = finished.usage
    ev = rec.engine
    path = ev.usage.reuse_path if ev is not None else "root"
    computed = ev.usage.prefill_tokens if ev is not None else u.prompt_tokens - u.cached_tokens
    prefill_s = ev.timings.prefill_s if ev is not None else None
    decode_s = ev.timings.decode_s if ev is not None else None
    pct = 100.0 * u.cached_tokens / u.prompt_tokens if u.prompt_tokens else 0.0
    parts = [
        f"{count(u.prompt_tokens)} prompt + {count(u.completion_tokens)} output tokens",
        f"cache {count(u.cached_tokens)} ({pct:.0f}%, {REUSE_LABELS.get(path, path)})",
        f"ttft {seconds(rec.ttft_s)}",
        f"prefill {rate(per_second(computed, prefill_s))} tok/s",
        f"decode {rate(per_second(max(u.completion_tokens - 1, 0), decode_s))} tok/s",
        f"total {seconds(rec.total_s)}",
    ]
    if ev is not None and ev.usage.preemptions:
        parts.append(f"paused {ev.usage.preemptions}x ({seconds(ev.timings.paused_s)})")
    return f"{_name(rec)} {finished.reason}: " + ", ".join(parts)
