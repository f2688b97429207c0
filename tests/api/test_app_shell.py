"""The HTTP shell: health, models, auth, CORS, request ids, body limit and error shape, served
by the real Litestar app through its test client (no engine needed)."""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Any

import pytest
from litestar import Request, get, post
from litestar.response import Stream
from litestar.testing import TestClient

from ninfer.api.server.app import create_app
from ninfer.api.server.config import ServeConfig
from ninfer.api.server.state import ServerState
from ninfer.api.wire import errors
from tests.api.live_app import serve_config

MODEL = "org/tiny-model"
KEY = "local-secret"


# Probe endpoints mounted next to the shell's own, to observe what reaches a handler.
calls: list[str] = []


@post("/v1/probe")
async def probe(request: Request[Any, Any, Any]) -> dict[str, Any]:
    body = await request.body()
    calls.append("probe")
    return {
        "bytes": len(body),
        "sha256": hashlib.sha256(body).hexdigest(),
        "request_id": request.state.request_id,
    }


@get("/v1/stream", sync_to_thread=False)
def stream() -> Stream:
    async def events():
        for i in range(3):
            yield f"data: {i}\n\n"
        yield "data: [DONE]\n\n"

    return Stream(events(), media_type="text/event-stream")


@get("/v1/boom", sync_to_thread=False)
def boom() -> None:
    raise RuntimeError("internal detail that must not leak")


@get("/v1/refuse", sync_to_thread=False)
def refuse() -> None:
    raise errors.invalid_value("temperature", "must be in [0, 2], got 3")


@post("/v1/messages/probe", sync_to_thread=False)
def anthropic_probe() -> dict[str, str]:
    return {"ok": "yes"}


@post("/v1/after-body")
async def after_body(request: Request[Any, Any, Any]) -> dict[str, Any]:
    body = await request.body()
    message = await request.receive()  # the next ASGI message: the client's disconnect
    return {"bytes": len(body), "next": message["type"]}


PROBES = [probe, stream, boom, refuse, anthropic_probe, after_body]


def make_client(**options: Any) -> TestClient:
    options.setdefault("max_context", 4096)
    state = ServerState(config=serve_config(**options), model_id=MODEL, created=1700000000)
    app = create_app(state, protocol_modules=(), extra_handlers=PROBES)
    client = TestClient(app=app, raise_server_exceptions=False)
    client.headers["content-type"] = "application/json"  # bodies are JSON (415 otherwise)
    return client


@pytest.fixture
def client():
    with make_client() as c:
        yield c


def assert_openai_error(resp, status: int, code: str, param: str | None = None) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == code and err["param"] == param
    assert isinstance(err["message"], str) and err["message"]
    return err


# -- health and models --------------------------------------------------------------------------


def test_health_ok_then_unavailable_after_engine_failure():
    with make_client() as c:
        r = c.get("/health")
        assert (r.status_code, r.json()) == (200, {"status": "ok"})
        r = c.head("/health")  # probes that send HEAD get the status without a body
        assert (r.status_code, r.content) == (200, b"")
        c.app.state.server.failure = "worker died"
        r = c.get("/health")
        assert (r.status_code, r.json()) == (503, {"status": "unavailable"})
        assert c.head("/health").status_code == 503


def test_health_follows_the_engine():
    """A real engine (over the fake executor of the runtime tests): ready while its worker
    runs, unavailable once the worker has stopped."""
    from ninfer.runtime.config import EngineOptions
    from ninfer.runtime.engine import Engine
    from ninfer.runtime.executors.sampler import Sampler
    from tests.runtime.fake_executor import FakeExecutor

    cfg = EngineOptions.of(max_context=64, page_size=16)
    engine = Engine(cfg, FakeExecutor(cfg.num_pages, cfg.page_size), Sampler(), eos_ids=[0])
    try:
        with make_client() as c:
            c.app.state.server.engine = engine
            assert c.get("/health").json() == {"status": "ok"}
            engine.close()
            r = c.get("/health")
            assert (r.status_code, r.json()) == (503, {"status": "unavailable"})
    finally:
        engine.close()


def test_models_list_and_lookup(client):
    r = client.get("/v1/models")
    assert r.status_code == 200
    card = {
        "id": MODEL,
        "object": "model",
        "created": 1700000000,
        "owned_by": "ninfer",
        "max_model_len": 4096,
        # Anthropic's Models API serves the same paths: its fields too
        "type": "model",
        "display_name": MODEL,
        "created_at": "2023-11-14T22:13:20Z",
    }
    page = {"has_more": False, "first_id": MODEL, "last_id": MODEL}
    assert r.json() == {"object": "list", "data": [card], **page}
    r = client.get(f"/v1/models/{MODEL}")  # an id with a slash is one path parameter
    assert (r.status_code, r.json()) == (200, card)


def test_unknown_model_is_404_model_not_found(client):
    err = assert_openai_error(client.get("/v1/models/other"), 404, "model_not_found", "model")
    assert "other" in err["message"] and MODEL in err["message"]
    assert err["type"] == "invalid_request_error"


def test_head_is_get_without_the_body(client):
    """RFC 9110: HEAD wherever GET is, with GET's status and headers and no body."""
    for path in ("/v1/models", f"/v1/models/{MODEL}", "/v1/models/other", "/health"):
        got, head = client.get(path), client.head(path)
        assert head.status_code == got.status_code and head.content == b""
        assert head.headers["content-type"] == got.headers["content-type"]
        assert head.headers["content-length"] == got.headers["content-length"]


def test_wrong_method_lists_the_allowed_ones(client):
    r = client.delete("/v1/models")
    assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD, OPTIONS"
    r = client.get("/v1/probe")  # a POST route
    assert r.status_code == 405 and r.headers["allow"] == "POST, OPTIONS"
    r = client.head("/v1/probe")
    assert (r.status_code, r.content, r.headers["allow"]) == (405, b"", "POST, OPTIONS")


def test_anthropic_clients_get_anthropic_errors_from_the_models_api():
    """The model card serves both SDKs; so do its errors: the Anthropic shape and request-id
    header when the request carries anthropic-version (the Anthropic SDK always sends it, and
    reads its request_id from that header)."""
    with make_client() as c:
        r = c.get("/v1/models/nope", headers={"anthropic-version": "2023-06-01"})
        body = r.json()
        assert r.status_code == 404 and body["type"] == "error"
        assert body["error"]["type"] == "not_found_error" and "nope" in body["error"]["message"]
        assert r.headers["request-id"] == r.headers["x-request-id"]  # it is OpenAI's too
        assert r.headers["request-id"].startswith("req_")
        assert c.get("/v1/models/nope").json()["error"]["code"] == "model_not_found"


def test_openai_client_reads_models():
    import httpx
    import openai

    with make_client(max_context=1234) as c:
        oa = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=c)  # type: ignore[arg-type]
        assert [m.id for m in oa.models.list().data] == [MODEL]
        model = oa.models.retrieve(MODEL)
        assert model.id == MODEL and model.model_extra["max_model_len"] == 1234
        with pytest.raises(openai.NotFoundError) as e:
            oa.models.retrieve("nope")
        assert e.value.code == "model_not_found"
        assert isinstance(e.value.response, httpx.Response)


# -- errors -------------------------------------------------------------------------------------


def test_unknown_route_wrong_method_and_internal_errors_use_the_openai_shape(client):
    assert_openai_error(client.get("/v1/nothing"), 404, "not_found")
    assert_openai_error(client.delete("/v1/models"), 405, "method_not_allowed")
    err = assert_openai_error(client.get("/v1/boom"), 500, "internal_error")
    assert "internal detail" not in err["message"] and err["type"] == "server_error"
    err = assert_openai_error(client.get("/v1/refuse"), 400, "invalid_value", "temperature")
    assert err["type"] == "invalid_request_error"


# -- request ids --------------------------------------------------------------------------------


def test_every_openai_response_has_a_unique_request_id(client):
    responses = [
        client.get("/v1/models"),
        client.get("/v1/models/nope"),  # 404
        client.get("/v1/nothing"),  # unknown route
        client.get("/v1/boom"),  # 500
        client.get("/v1/refuse"),  # 400
        client.get("/health"),
        client.post("/v1/probe", content=b"{}"),
        client.get("/v1/stream"),
    ]
    ids = [r.headers.get("x-request-id") for r in responses]
    assert all(ids), ids
    assert len(set(ids)) == len(ids)
    # The handler sees the same id the client gets.
    r = client.post("/v1/probe", content=b"{}")
    assert r.json()["request_id"] == r.headers["x-request-id"]


def test_streams_carry_the_request_id(client):
    with client.stream("GET", "/v1/stream") as r:
        assert r.headers["x-request-id"]
        assert r.headers["content-type"].startswith("text/event-stream")
        assert "".join(r.iter_text()).endswith("data: [DONE]\n\n")


def test_anthropic_endpoints_use_their_own_request_id_contract(client):
    r = client.post("/v1/messages/probe", content=b"{}")
    assert r.status_code == 201 and "x-request-id" not in r.headers


# -- authentication -----------------------------------------------------------------------------


@pytest.fixture
def authed():
    with make_client(api_key=KEY) as c:
        yield c


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Basic {KEY}"},
        {"Authorization": KEY},
        {"x-api-key": "wrong"},
        {"x-api-key": KEY[:-1]},
    ],
)
def test_missing_or_wrong_key_is_401(authed, headers):
    r = authed.get("/v1/models", headers=headers)
    err = assert_openai_error(r, 401, "invalid_api_key")
    assert err["type"] == "authentication_error"
    assert r.headers["x-request-id"]


@pytest.mark.parametrize(
    "headers",
    [{"Authorization": f"Bearer {KEY}"}, {"authorization": f"bearer {KEY}"}, {"x-api-key": KEY}],
)
def test_right_key_is_accepted(authed, headers):
    assert authed.get("/v1/models", headers=headers).status_code == 200
    assert authed.post("/v1/probe", content=b"{}", headers=headers).status_code == 201


def test_auth_runs_before_the_handler(authed):
    calls.clear()
    assert authed.post("/v1/probe", content=b"{}").status_code == 401
    assert calls == []


def test_health_and_preflight_are_unauthenticated(authed):
    assert authed.get("/health").status_code == 200
    r = authed.options(
        "/v1/chat/completions",
        headers={"Origin": "http://example.com", "Access-Control-Request-Method": "POST"},
    )
    assert r.status_code != 401
    # A plain OPTIONS (not a preflight) still needs the key.
    assert authed.options("/v1/models").status_code == 401


def test_openai_client_with_api_key():
    import openai

    with make_client(api_key=KEY) as c:
        good = openai.OpenAI(base_url="http://testserver/v1", api_key=KEY, http_client=c)  # type: ignore[arg-type]
        assert good.models.list().data[0].id == MODEL
        bad = openai.OpenAI(
            base_url="http://testserver/v1", api_key="nope", http_client=c, max_retries=0
        )  # type: ignore[arg-type]
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()


# -- CORS ---------------------------------------------------------------------------------------


def test_cors_off_by_default(client):
    r = client.get("/v1/models", headers={"Origin": "http://example.com"})
    assert "access-control-allow-origin" not in r.headers


def test_cors_preflight_and_simple_requests():
    with make_client(cors=True, api_key=KEY) as c:
        r = c.options(
            "/v1/chat/completions",
            headers={
                "Origin": "http://example.com",
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type",
            },
        )
        assert r.status_code == 204
        assert r.headers["access-control-allow-origin"] == "*"
        assert "POST" in r.headers["access-control-allow-methods"]
        assert "authorization" in r.headers["access-control-allow-headers"]
        assert r.headers["x-request-id"]
        ok = c.get("/v1/models", headers={"Origin": "http://example.com", "x-api-key": KEY})
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "*"
        assert "x-request-id" in ok.headers["access-control-expose-headers"]
        # A browser must be able to read the 401 too.
        denied = c.get("/v1/models", headers={"Origin": "http://example.com"})
        assert denied.status_code == 401 and denied.headers["access-control-allow-origin"] == "*"


# -- body limit ---------------------------------------------------------------------------------

MIB = 1024 * 1024


def test_body_at_the_limit_reaches_the_handler_intact():
    with make_client(max_request_mib=1) as c:
        body = bytes(range(256)) * (MIB // 256)
        r = c.post("/v1/probe", content=body)
        assert r.status_code == 201
        assert r.json()["bytes"] == MIB and r.json()["sha256"] == hashlib.sha256(body).hexdigest()


def test_body_over_the_limit_is_413_before_the_handler():
    with make_client(max_request_mib=1) as c:
        calls.clear()
        r = c.post("/v1/probe", content=b"x" * (MIB + 1))
        err = assert_openai_error(r, 413, "request_too_large")
        assert "1 MiB" in err["message"] and r.headers["x-request-id"]
        assert calls == []


def test_chunked_body_over_the_limit_is_413():
    def chunks():
        for _ in range(5):
            yield b"y" * (MIB // 4)

    with make_client(max_request_mib=1) as c:
        calls.clear()
        r = c.post("/v1/probe", content=chunks())
        assert_openai_error(r, 413, "request_too_large")
        assert calls == []


def test_default_limit_is_far_above_litestars_own():
    with make_client() as c:  # 384 MiB; Litestar alone would refuse this 12 MB body
        r = c.post("/v1/probe", content=b"z" * 12_000_000)
        assert r.status_code == 201 and r.json()["bytes"] == 12_000_000


def test_handlers_still_observe_the_disconnect_after_the_body():
    """The body is buffered by the limit layer; later receive() calls reach the server."""
    state = ServerState(config=ServeConfig(), model_id=MODEL)
    app = create_app(state, protocol_modules=(), extra_handlers=PROBES)
    inbox = [
        {"type": "http.request", "body": b"ab", "more_body": True},
        {"type": "http.request", "body": b"c", "more_body": False},
        {"type": "http.disconnect"},
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return inbox.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": "/v1/after-body", "raw_path": b"/v1/after-body", "query_string": b"",
        "root_path": "", "headers": [(b"host", b"testserver")], "client": ("127.0.0.1", 1),
        "server": ("testserver", 80),
    }  # fmt: skip
    asyncio.run(app(scope, receive, send))
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    assert json.loads(body) == {"bytes": 3, "next": "http.disconnect"}


# -- protocol module registration ---------------------------------------------------------------


def test_protocol_modules_register_their_handlers(tmp_path, monkeypatch):
    (tmp_path / "ninfer_probe_protocol.py").write_text(
        "from litestar import post\n"
        "def route_handlers(state):\n"
        "    @post('/v1/chat/completions', sync_to_thread=False)\n"
        "    def chat() -> dict:\n"
        "        return {'model': state.model_id}\n"
        "    return [chat]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    state = ServerState(config=ServeConfig(), model_id=MODEL)
    app = create_app(
        state, protocol_modules=("ninfer_probe_protocol", "ninfer.api.not_written_yet")
    )
    with TestClient(app=app) as c:
        r = c.post("/v1/chat/completions", json={})
        assert r.json() == {"model": MODEL} and r.headers["x-request-id"]


def test_a_broken_protocol_module_is_not_silently_skipped(tmp_path, monkeypatch):
    (tmp_path / "ninfer_broken_protocol.py").write_text("import ninfer_missing_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    state = ServerState(config=ServeConfig(), model_id=MODEL)
    with pytest.raises(ModuleNotFoundError):
        create_app(state, protocol_modules=("ninfer_broken_protocol",))


# -- engine refusals ----------------------------------------------------------------------------


def test_engine_refusals_map_to_their_http_errors():
    from ninfer.runtime.request import EngineError, EngineOverloaded, QueueTimeout, RequestError

    over = errors.from_engine_error(EngineOverloaded("full"), pending_timeout_ms=30000)
    assert (over.status, over.code, over.type) == (429, "server_overloaded", "rate_limit_error")
    late = errors.from_engine_error(QueueTimeout("late"), pending_timeout_ms=250)
    assert (late.status, late.code) == (503, "request_queue_timeout") and "250 ms" in late.message
    bad = errors.from_engine_error(RequestError("the prompt is empty"), pending_timeout_ms=1)
    assert (bad.status, bad.message) == (400, "the prompt is empty")
    assert errors.from_engine_error(EngineError("step failed"), pending_timeout_ms=1) is None
    assert errors.from_engine_error(RuntimeError("bug"), pending_timeout_ms=1) is None


def test_context_length_exceeded_reports_the_counts():
    err = errors.context_length_exceeded(9000, 8192)
    assert (err.status, err.code) == (400, "context_length_exceeded")
    assert "9000" in err.message and "8192" in err.message
