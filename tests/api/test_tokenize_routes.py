"""`/tokenize`, `/detokenize` (llama.cpp and vLLM shapes) and the OpenAI paths without `/v1`,
on the real in-process server with the trained tiny agent. The reference tokenizer is the
artifact's own tokenizer JSON loaded with `tokenizers`; the chat rendering reference is the
prompt token count Chat Completions reports; aliases are driven with the official openai client.
"""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from litestar.testing import TestClient
from tokenizers import Tokenizer

from ninfer.artifact import Artifact
from tests.api.live_app import app_client

KEY = "secret"
AUTH = {"Authorization": f"Bearer {KEY}"}
MAX_CONTEXT = 1024
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is the weather in Paris?"},
]


@pytest.fixture(scope="module")
def client(tiny_agent) -> Iterator[TestClient]:
    with app_client(
        tiny_agent, max_context=MAX_CONTEXT, thinking=False, api_key=KEY, cors=True,
        max_request_mib=1,
    ) as c:  # fmt: skip
        c.headers.update(AUTH)
        yield c


@pytest.fixture(scope="module")
def ref(tiny_agent) -> Tokenizer:
    return Tokenizer.from_str(Artifact(tiny_agent).tokenizer_json)


@pytest.fixture(scope="module")
def model(client) -> str:
    return client.get("/v1/models").json()["data"][0]["id"]


def error(r) -> tuple[int, str, str]:
    e = r.json()["error"]
    return r.status_code, e["code"], e["param"]


# -- llama.cpp shape --------------------------------------------------------------------------


def test_llama_tokenize_matches_the_tokenizer(client, ref):
    text = "Hello world, ünïcode ✓ 12345"
    r = client.post("/tokenize", json={"content": text})
    assert r.status_code == 200 and r.json() == {
        "tokens": ref.encode(text, add_special_tokens=False).ids
    }
    with_special = client.post("/tokenize", json={"content": text, "add_special": True}).json()
    assert with_special["tokens"] == ref.encode(text, add_special_tokens=True).ids


def test_llama_with_pieces_spell_the_text(client, ref):
    text = "Hello ✓ world"
    toks = client.post("/tokenize", json={"content": text, "with_pieces": True}).json()["tokens"]
    assert [t["id"] for t in toks] == ref.encode(text, add_special_tokens=False).ids
    raw = b"".join(
        bytes(t["piece"]) if isinstance(t["piece"], list) else t["piece"].encode() for t in toks
    )
    assert raw.decode() == text


def test_llama_parse_special(client, ref):
    text = "<|im_start|>user"
    special = client.post("/tokenize", json={"content": text}).json()["tokens"]
    assert special[0] == ref.token_to_id("<|im_start|>")
    plain = client.post("/tokenize", json={"content": text, "parse_special": False}).json()[
        "tokens"
    ]
    assert ref.token_to_id("<|im_start|>") not in plain and len(plain) > len(special)
    assert client.post("/detokenize", json={"tokens": plain}).json()["content"] == text


# -- vLLM shape -------------------------------------------------------------------------------


def test_vllm_prompt(client, ref, model):
    text = "Hello world"
    r = client.post("/tokenize", json={"model": model, "prompt": text, "return_token_strs": True})
    ids = ref.encode(text, add_special_tokens=True).ids
    assert r.json() == {
        "count": len(ids), "max_model_len": MAX_CONTEXT, "tokens": ids,
        "token_strs": [ref.id_to_token(i) for i in ids],
    }  # fmt: skip
    bare = client.post("/tokenize", json={"prompt": text, "add_special_tokens": False}).json()
    assert bare["tokens"] == ref.encode(text, add_special_tokens=False).ids


def test_vllm_messages_render_like_chat(client, model):
    r = client.post("/tokenize", json={"model": model, "messages": MESSAGES}).json()
    chat = client.post(
        "/v1/chat/completions", json={"model": model, "messages": MESSAGES, "max_tokens": 1}
    ).json()
    assert r["count"] == len(r["tokens"]) == chat["usage"]["prompt_tokens"]
    history = client.post(
        "/tokenize", json={"messages": MESSAGES, "add_generation_prompt": False}
    ).json()["tokens"]
    assert len(history) < r["count"] and r["tokens"][: len(history)] == history
    text = client.post("/detokenize", json={"model": model, "tokens": r["tokens"]}).json()
    assert set(text) == {"prompt"}
    assert text["prompt"].startswith("<|im_start|>system\nBe brief.<|im_end|>")
    assert "<|im_end|>\n<|im_start|>assistant\n" in text["prompt"]


# -- detokenize -------------------------------------------------------------------------------


def test_detokenize_shapes_and_range(client, ref, model):
    ids = ref.encode("Hi there", add_special_tokens=False).ids
    assert client.post("/detokenize", json={"tokens": ids}).json() == {
        "content": "Hi there", "prompt": "Hi there",
    }  # fmt: skip
    vocab = ref.get_vocab_size(with_added_tokens=True)
    r = client.post("/detokenize", json={"tokens": [ids[0], vocab]})
    assert error(r) == (400, "invalid_value", "tokens[1]")
    assert error(client.post("/detokenize", json={"tokens": [-1]})) == (
        400,
        "invalid_value",
        "tokens[0]",
    )
    assert error(client.post("/detokenize", json={"tokens": [True]})) == (
        400,
        "invalid_type",
        "tokens[0]",
    )
    assert error(client.post("/detokenize", json={})) == (
        400,
        "missing_required_parameter",
        "tokens",
    )


@pytest.mark.parametrize(
    "path, body, expected",
    [
        ("/tokenize", {}, (400, "missing_required_parameter", "content")),
        ("/tokenize", {"content": "a", "prompt": "b"}, (400, "invalid_value", "prompt")),
        ("/tokenize", {"prompt": "a", "messages": MESSAGES}, (400, "invalid_value", "messages")),
        (
            "/tokenize",
            {"content": "a", "add_special_tokens": True},
            (400, "unknown_parameter", "add_special_tokens"),
        ),
        (
            "/tokenize",
            {"prompt": "a", "add_generation_prompt": True},
            (400, "unknown_parameter", "add_generation_prompt"),
        ),
        ("/tokenize", {"content": 3}, (400, "invalid_type", "content")),
        (
            "/tokenize",
            {"messages": [{"role": "user"}]},
            (400, "missing_required_parameter", "messages[0].content"),
        ),
        ("/tokenize", {"prompt": "a", "model": "other"}, (404, "model_not_found", "model")),
        ("/detokenize", {"tokens": [1], "text": "x"}, (400, "unknown_parameter", "text")),
    ],
)
def test_errors_name_the_field(client, path, body, expected):
    assert error(client.post(path, json=body)) == expected


# -- aliases, auth, CORS, limits ----------------------------------------------------------------


def test_unversioned_aliases_with_the_openai_client(client, model):
    oa = openai.OpenAI(
        base_url=str(client.base_url), api_key=KEY, http_client=client, max_retries=0
    )
    assert [m.id for m in oa.models.list()] == [model]
    chat = oa.chat.completions.create(model=model, messages=MESSAGES, max_tokens=2, temperature=0)
    v1 = client.post(
        "/v1/chat/completions",
        json={"model": model, "messages": MESSAGES, "max_tokens": 2, "temperature": 0},
    ).json()
    assert chat.choices[0].message.content == v1["choices"][0]["message"]["content"]
    resp = oa.responses.create(model=model, input="Hi!", max_output_tokens=2, store=True)
    assert oa.responses.retrieve(resp.id).id == resp.id
    assert client.get(f"/models/{model}").json()["id"] == model
    assert client.get("/chat/completionsX").status_code == 404


@pytest.mark.parametrize(
    "path", ["/tokenize", "/detokenize", "/chat/completions", "/responses", "/models"]
)
def test_new_routes_need_the_key_and_answer_cors(client, path):
    method = client.get if path == "/models" else client.post
    r = method(
        path,
        headers={"Authorization": "Bearer wrong"},
        **({} if path == "/models" else {"json": {}}),
    )
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    pre = client.options(
        path, headers={"Origin": "http://x.test", "Access-Control-Request-Method": "POST"}
    )
    assert pre.status_code in (200, 204) and pre.headers["access-control-allow-origin"] == "*"


def test_body_limit_applies(client):
    r = client.post("/tokenize", json={"content": "a" * (1 << 21)})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
