"""Large request bodies screened in a worker process, so that a prompt far over the context is
refused without its text ever being built in the server process.

Why: refusing a maximal body in the server meant decoding it, building its prompt strings and
rendering them. Each of those strings (8M characters of an 8 MiB body, 32 MB once a character
needs four bytes) is made by one C call that holds the GIL; on fresh memory of the shared
2-core test machine each took 27-90 ms, and /health, served by the same process, waited as
long. Here the body is decoded, validated, rendered and counted by the same code in another
process; the server receives at most a short copy of the body.

    handler ─raw body─▶ BodyScreen ─pipe─▶ worker: decode, validate, `protocol_fn`, prepare_prompt
        ◀─ None: nothing proven; the server prepares the body itself, as for any body
        ◀─ slim body + refusal: the request refused with context_length_exceeded

The slim body is the body with every long string (over SLIM_CHARS characters) replaced by one
marker, checked by the worker to validate like the body. The handler parses it instead of the
body and goes on as usual: every check before preparation (capacity, shutdown, choices, the
store) runs as it would have; then `screened_refusal` finds the marker in the request's
messages and preparation raises the worker's error, which is the error `prepare_prompt` raises
for the whole body (same code, same inputs). A body with media, or one the worker cannot
judge (any other error, a prompt that fits), is prepared in the server, as before.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import secrets
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from ninfer.api.service.generation import GenerationRequest
from ninfer.api.wire.errors import ApiError

log = logging.getLogger("ninfer.serve")

SCREEN_BYTES = 1 << 20  # bodies above this are screened (smaller ones build strings of <4 MB)
MAX_FAILURES = 3  # workers lost in a row (it cannot start, or dies) before screening stops
SLIM_CHARS = 1024  # strings longer than this are left out of the slim body
_MARK = "\U000f8000"  # plane-15 private use: starts the marker of a slim body

# A request's refusal, from the worker: (marker, error). Set in the handler's task by
# `BodyScreen.bind`'s screen, read by preparation (copied into its worker thread).
_REFUSAL: contextvars.ContextVar[tuple[str, ApiError] | None] = contextvars.ContextVar(
    "ninfer_screened_refusal", default=None
)

# protocol_fn(state, body) -> the GenerationRequest the handler would prepare for `body`: a
# module-level function of the protocol package (sent to the worker by name)
ProtocolFn = Callable[[Any, dict[str, Any]], GenerationRequest]


@dataclass(frozen=True)
class ScreenSetup:
    """What the worker needs to prepare prompts as the server does: the tokenizer (JSON), the
    chat template (source, control tokens, special-token variables), the effective context
    ceiling, and a `ServerState` holding the serve options and model id (no engine)."""

    tokenizer_json: str
    template_source: str
    control_tokens: tuple[str, ...]
    special_tokens: dict[str, str]
    max_context: int
    state: Any


class BodyScreen:
    """The worker process (spawned on first use, one body at a time) and its client. A worker
    that dies is replaced on the next body; meanwhile bodies are prepared in the server."""

    def __init__(self, setup: ScreenSetup) -> None:
        self.setup = setup
        self.refused = 0  # bodies refused from the worker's verdict (for tests and logs)
        self.failures = 0  # workers lost in a row; at MAX_FAILURES screening stops
        self._lock = threading.Lock()
        self._process: Any = None
        self._conn: Connection | None = None

    def bind(self, fn: ProtocolFn) -> Callable[[bytes], Awaitable[bytes | None]]:
        """The `screen` of `decode_body` for one protocol: the slim body to parse instead of
        `raw` (after recording the refusal for preparation), or None to parse `raw`."""

        async def screen(raw: bytes) -> bytes | None:
            if len(raw) <= SCREEN_BYTES:
                return None
            reply = await asyncio.to_thread(self._ask, fn, raw)
            if reply is None:
                return None
            slim, marker, error = reply
            _REFUSAL.set((marker, error))
            self.refused += 1
            return slim

        return screen

    def close(self) -> None:
        """Stop the worker (if one runs) and screen no more bodies. Without waiting for a body
        it is screening: the request that sent it gets None (prepared in the server)."""
        self.failures = MAX_FAILURES
        process = self._process
        if process is not None:
            process.kill()  # a body in progress may take seconds; its caller sees EOF
            process.wait()
        if self._lock.acquire(blocking=False):  # else the caller in progress cleans up
            try:
                self._stop()
            finally:
                self._lock.release()

    def _ask(self, fn: ProtocolFn, raw: bytes) -> tuple[bytes, str, ApiError] | None:
        with self._lock:
            if self.failures >= MAX_FAILURES:
                return None
            try:
                conn = self._connection()
                conn.send(fn)
                conn.send_bytes(raw)  # written from `raw`, in pieces, the GIL released
                reply = conn.recv()
            except (EOFError, OSError) as e:
                self.failures += 1
                stopped = "; large bodies are prepared in the server from now on"
                log.warning(
                    "the body-screening worker failed (%r)%s",
                    e,
                    stopped if self.failures >= MAX_FAILURES else "",
                )
                self._stop()
                return None
            self.failures = 0
        if reply is None:
            return None
        slim, marker, (status, message, type_, code, param) = reply
        return slim, marker, ApiError(status, message, type=type_, code=code, param=param)

    def _connection(self) -> Connection:
        if self._conn is None:
            # a fresh interpreter (nothing of the server's threads or its __main__), talking
            # over one socket pair; it exits when the server's end closes
            ours, theirs = socket.socketpair()
            process = subprocess.Popen(
                [sys.executable, "-m", "ninfer.api.service.body_screen", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
            )
            theirs.close()
            conn = Connection(ours.detach())
            try:
                conn.send(self.setup)
            except OSError:
                conn.close()
                process.kill()
                process.wait()
                raise
            self._process, self._conn = process, conn
        return self._conn

    def _stop(self) -> None:
        if self._conn is not None:
            self._conn.close()  # the worker's recv ends: it exits
        if self._process is not None:
            try:
                self._process.wait(5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = self._conn = None


def screened_refusal(req: GenerationRequest) -> ApiError | None:
    """The worker's refusal of `req`, when `req` was parsed from a slim body in this task (its
    messages hold the marker); else None."""
    refusal = _REFUSAL.get()
    if refusal is None:
        return None
    marker, error = refusal
    return error if any(marker in s for s in _strings(req.messages)) else None


# ---------------------------------------------------------------------------------------------
# The worker process
# ---------------------------------------------------------------------------------------------


def _serve(conn: Connection) -> None:
    """The worker's loop: its ScreenSetup, then (protocol_fn, raw body) in and `_screen`'s
    reply out, until the server closes the connection."""
    from tokenizers import Tokenizer

    try:
        setup: ScreenSetup = conn.recv()
    except (EOFError, OSError):
        return

    from ninfer.api.service.prompt_encoding import PromptEncoder
    from ninfer.api.service.template import ChatTemplate

    template = ChatTemplate(
        setup.template_source,
        control_tokens=setup.control_tokens,
        special_tokens=setup.special_tokens,
    )
    encoder = PromptEncoder(Tokenizer.from_str(setup.tokenizer_json), template.control_tokens)
    while True:
        try:
            fn = conn.recv()
            raw = conn.recv_bytes()
        except (EOFError, OSError):
            return
        try:
            conn.send(_screen(fn, raw, setup, template, encoder))
        except OSError:  # the server is gone
            return


def _screen(fn: ProtocolFn, raw: bytes, setup: ScreenSetup, template: Any, encoder: Any) -> Any:
    """None, or (slim body, marker, refusal fields) when preparing `raw` as the server would
    raises context_length_exceeded and the slim body parses to a request holding the marker."""
    from ninfer.api.service.prompt_prep import screen_prompt
    from ninfer.api.wire.fields import parse_json_object

    try:
        body = parse_json_object(raw)
        req = fn(setup.state, body)
        # a request with media raises ValueError: the server prepares it
        screen_prompt(req, template=template, encoder=encoder, max_context=setup.max_context)
        return None  # not proven over the context: the server prepares it
    except ApiError as e:
        if e.code != "context_length_exceeded":
            return None
        refusal = (e.status, e.message, e.type, e.code, e.param)
    except Exception:  # noqa: BLE001 - the server prepares it and reports what it meets
        return None
    marker = f"{_MARK}{secrets.token_hex(8)}"
    slim = json.dumps(_slimmed(body, marker), ensure_ascii=False).encode()
    try:
        slim_req = fn(setup.state, parse_json_object(slim))
    except Exception:  # noqa: BLE001 - a long string the request needs whole (JSON text)
        return None
    if not any(marker in s for s in _strings(slim_req.messages)):
        return None
    return slim, marker, refusal


def _slimmed(value: Any, marker: str) -> Any:
    """`value` (decoded JSON) with every string longer than SLIM_CHARS replaced by `marker`."""
    if isinstance(value, str):
        return marker if len(value) > SLIM_CHARS else value
    if isinstance(value, dict):
        return {k: _slimmed(v, marker) for k, v in value.items()}
    if isinstance(value, list):
        return [_slimmed(v, marker) for v in value]
    return value


def _strings(value: Any) -> Iterator[str]:
    """Every string value inside `value` (mappings, lists, tuples, dataclass-free data)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            yield v
        elif isinstance(v, Mapping):
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)


if __name__ == "__main__":  # the worker: python -m ninfer.api.service.body_screen FD
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the server, which stops this
    _serve(Connection(int(sys.argv[1])))
