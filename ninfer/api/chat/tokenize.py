"""`POST /tokenize` and `POST /detokenize` in llama.cpp's and vLLM's shapes (docs/serving.md,
"Tokenize and detokenize").

One route per path; the fields sent choose the shape:

    /tokenize   {content, add_special?, parse_special?, with_pieces?}          llama.cpp
                -> {"tokens": [id, ...]} or, with with_pieces, [{"id", "piece"}, ...]
    /tokenize   {model?, prompt, add_special_tokens? (default true), return_token_strs?}
                {model?, messages, add_generation_prompt? (default true),
                 continue_final_message?, add_special_tokens? (default false), tools?,
                 chat_template_kwargs?, return_token_strs?}                     vLLM
                -> {"count", "max_model_len", "tokens"[, "token_strs"]}
    /detokenize {tokens}          -> {"content", "prompt"} (either client reads its key)
    /detokenize {model, tokens}   -> {"prompt"}                                 vLLM

`messages` are rendered with the served chat template and encoded exactly as a Chat
Completions request with the same messages and tools (control tokens only where the template
put them); on a --vision server their images and videos are prepared and expanded into their
vision tokens, as vLLM counts them. Unknown fields, mixed shapes and tokens outside the vocabulary are 400 naming the
field. Decoding keeps special tokens' text, as both servers do.
"""

from __future__ import annotations

import asyncio
from typing import Any

from litestar import Request, post
from litestar.handlers import BaseRouteHandler
from tokenizers import Tokenizer

from ninfer.api.server.state import ServerState
from ninfer.api.service.detokenize import _token_bytes
from ninfer.api.service.media_path import release
from ninfer.api.service.media_prompt import split_media
from ninfer.api.wire import errors
from ninfer.api.wire.errors import ApiError
from ninfer.api.wire.fields import get_array, get_bool, get_str, parse_json_object

LLAMA_FIELDS = frozenset({"content", "add_special", "parse_special", "with_pieces"})
VLLM_TEXT_FIELDS = frozenset({"model", "prompt", "add_special_tokens", "return_token_strs"})
VLLM_CHAT_FIELDS = frozenset({
    "model", "messages", "add_generation_prompt", "continue_final_message", "add_special_tokens",
    "tools", "chat_template_kwargs", "return_token_strs",
})  # fmt: skip


def _unknown(name: str, shape: str) -> ApiError:
    return ApiError(
        400, f"unknown parameter '{name}' for {shape}", code="unknown_parameter", param=name
    )


def _check_fields(body: dict[str, Any], known: frozenset[str], shape: str) -> None:
    for name in body:
        if name not in known:
            raise _unknown(name, shape)


def _check_model(body: dict[str, Any], state: ServerState) -> None:
    model = get_str(body, "model", nonempty=True)
    if model is not None and model != state.model_id:
        raise errors.model_not_found(model, state.model_id)


def _special_affixes(tok: Tokenizer) -> tuple[list[int], list[int]]:
    """The ids the tokenizer's post-processor puts before and after a text (BOS, EOS, ...)."""
    bare = tok.encode("a", add_special_tokens=False).ids
    full = tok.encode("a", add_special_tokens=True).ids
    for i in range(len(full) - len(bare) + 1):
        if full[i : i + len(bare)] == bare:
            return full[:i], full[i + len(bare) :]
    return [], []  # pragma: no cover - a post-processor that rewrites the text itself


def _pieces(tok: Tokenizer, ids: list[int]) -> list[dict[str, Any]]:
    """llama.cpp's with_pieces: each token's text, or its bytes when they are not UTF-8."""
    to_bytes = _token_bytes(tok)
    out = []
    for tid in ids:
        if to_bytes is None:
            piece: Any = tok.decode([tid], skip_special_tokens=False)
        else:
            raw = to_bytes(tid)
            try:
                piece = raw.decode("utf-8")
            except UnicodeDecodeError:
                piece = list(raw)
        out.append({"id": tid, "piece": piece})
    return out


def _tokenize_llama(service: Any, body: dict[str, Any]) -> dict[str, Any]:
    _check_fields(body, LLAMA_FIELDS, "llama.cpp's /tokenize (content)")
    content = get_str(body, "content", required=True)
    add_special = bool(get_bool(body, "add_special"))
    parse_special = get_bool(body, "parse_special") is not False
    with_pieces = bool(get_bool(body, "with_pieces"))
    tok: Tokenizer = service.tokenizer
    if parse_special:
        ids = tok.encode(content, add_special_tokens=add_special).ids
    else:  # special-token spellings in the text stay text
        ids = service.encoder.encode_text(content)
        if add_special:
            head, tail = _special_affixes(tok)
            ids = head + ids + tail
    return {"tokens": _pieces(tok, ids) if with_pieces else ids}


def _tokenize_vllm(
    state: ServerState, service: Any, body: dict[str, Any], loop: asyncio.AbstractEventLoop
) -> dict[str, Any]:
    tok: Tokenizer = service.tokenizer
    if "prompt" in body:
        _check_fields(body, VLLM_TEXT_FIELDS, "vLLM's /tokenize (prompt)")
        _check_model(body, state)
        prompt = get_str(body, "prompt", required=True)
        add_special = get_bool(body, "add_special_tokens") is not False
        ids = tok.encode(prompt, add_special_tokens=add_special).ids
    else:
        _check_fields(body, VLLM_CHAT_FIELDS, "vLLM's /tokenize (messages)")
        _check_model(body, state)
        ids = _render_messages(state, service, body, loop)
        if get_bool(body, "add_special_tokens"):
            head, tail = _special_affixes(tok)
            ids = head + ids + tail
    out: dict[str, Any] = {"count": len(ids), "max_model_len": state.max_model_len, "tokens": ids}
    if get_bool(body, "return_token_strs"):
        out["token_strs"] = [tok.id_to_token(i) for i in ids]
    return out


def _render_messages(
    state: ServerState, service: Any, body: dict[str, Any], loop: asyncio.AbstractEventLoop
) -> list[int]:
    """The prompt ids of `messages` as Chat Completions would render them, media placed (their
    preparation runs on the event loop `loop`; this runs on a worker thread)."""
    from ninfer.api.chat.endpoints import to_generation_request
    from ninfer.api.chat.request import parse_chat_request

    generation_prompt = get_bool(body, "add_generation_prompt") is not False
    continue_final = bool(get_bool(body, "continue_final_message"))
    if continue_final and "add_generation_prompt" in body and generation_prompt:
        raise errors.invalid_value(
            "continue_final_message", "excludes add_generation_prompt: true (send false)"
        )
    chat_body = {k: body[k] for k in ("messages", "tools", "chat_template_kwargs") if k in body}
    chat = parse_chat_request({**chat_body, "model": state.model_id}, model_id=state.model_id,
                              vision=state.config.vision)  # fmt: skip
    req = to_generation_request(chat, state)
    if continue_final and req.messages[-1].get("role") != "assistant":
        raise errors.invalid_value(
            "continue_final_message", "needs an assistant message last, to continue"
        )
    messages, media = split_media(req.messages, "messages")
    items = (
        asyncio.run_coroutine_threadsafe(service.prepare_media(req), loop).result() if media else []
    )
    try:
        rendered = service.template.render(
            messages,
            tools=req.tools,
            add_generation_prompt=generation_prompt and not continue_final,
            continue_final_message=continue_final,
            options=req.template_options,
        )
        ids = service.encoder.encode(rendered.text, rendered.special_spans)
        if items:
            ids = service.media.place(ids, items, service.encoder.encode_text, "messages").ids
        return ids
    finally:
        release(items)


def _detokenize(state: ServerState, service: Any, body: dict[str, Any]) -> dict[str, Any]:
    _check_fields(body, frozenset({"model", "tokens"}), "/detokenize")
    _check_model(body, state)
    tok: Tokenizer = service.tokenizer
    ids = get_array(body, "tokens", required=True)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    for i, t in enumerate(ids):  # type: ignore[arg-type]
        if isinstance(t, bool) or not isinstance(t, int):
            raise errors.invalid_type(f"tokens[{i}]", "an integer token id", t)
        if not 0 <= t < vocab:
            raise errors.invalid_value(
                f"tokens[{i}]", f"token id {t} is outside the vocabulary (0..{vocab - 1})"
            )
    text = tok.decode(list(ids), skip_special_tokens=False)  # type: ignore[arg-type]
    return {"prompt": text} if "model" in body else {"content": text, "prompt": text}


def _tokenize(
    state: ServerState, service: Any, body: dict[str, Any], loop: asyncio.AbstractEventLoop
) -> dict[str, Any]:
    llama, vllm = "content" in body, [k for k in ("prompt", "messages") if k in body]
    if llama and vllm:
        raise errors.invalid_value(
            vllm[0], "content (llama.cpp's shape) and prompt / messages (vLLM's) exclude each other"
        )
    if len(vllm) == 2:
        raise errors.invalid_value("messages", "send prompt or messages, not both")
    if not llama and not vllm:
        raise ApiError(
            400,
            "send content (llama.cpp's shape), prompt or messages (vLLM's)",
            code="missing_required_parameter",
            param="content",
        )
    return _tokenize_llama(service, body) if llama else _tokenize_vllm(state, service, body, loop)


def route_handlers(state: ServerState) -> list[BaseRouteHandler]:
    def service() -> Any:
        found = state.extra.get("service")
        if found is None:  # an HTTP-shell server without an engine has no tokenizer
            raise errors.engine_unavailable()
        return found

    # tokenizing a long text is CPU work: off the event loop, like the other prompt work
    @post("/tokenize", status_code=200)
    async def tokenize(request: Request[Any, Any, Any]) -> dict[str, Any]:
        body = parse_json_object(await request.body())
        loop = asyncio.get_running_loop()
        return await asyncio.to_thread(_tokenize, state, service(), body, loop)

    @post("/detokenize", status_code=200)
    async def detokenize(request: Request[Any, Any, Any]) -> dict[str, Any]:
        body = parse_json_object(await request.body())
        return await asyncio.to_thread(_detokenize, state, service(), body)

    return [tokenize, detokenize]
