"""`ninfer.LLM`: the offline Python API, a blocking client of the serving engine.

    llm = LLM("model.ninfer", device="cpu", dtype="float32", max_concurrency=8, kv_capacity=4096)
    out = llm.generate(["Hello"], SamplingParams(max_tokens=16, temperature=0.0))
    out = llm.chat([{"role": "user", "content": "Hi"}], SamplingParams(max_tokens=16))
    out[0].token_ids, out[0].text
    logits = llm.logits(token_ids)       # [len(token_ids), vocab] from one prefill

`LLM(...)` builds its engine with `build_engine` (ninfer/runtime/build.py), the same as `ninfer
serve`; `generate` submits one request per prompt and waits for them, so it gets what the server
gets: continuous batching, chunked prefill, prefix reuse, pausing under KV pressure. Stop strings
and EOS are handled as the server handles them (the same incremental detokenizer and stop
matcher; the engine is told to stop at a match), and `chat` renders messages with the same chat
template code as the server. It sits above the runtime beside `ninfer/api/` because it reuses
those text pieces.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import operator
import os
import queue
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ninfer.api.service.output_text import OutputText
from ninfer.artifact.format import Artifact
from ninfer.artifact.generation import artifact_defaults
from ninfer.passes.options import parse_kv_capacity
from ninfer.runtime.build import build_engine
from ninfer.runtime.config import NO_TIMEOUT_MS, EngineOptions
from ninfer.runtime.engine import Engine
from ninfer.runtime.handle import RequestHandle
from ninfer.runtime.media_span import MediaSpan
from ninfer.runtime.request import (
    EngineError,
    FinishEvent,
    Request,
    RequestError,
    SamplingParams,
    TokenLogprob,
    TokensEvent,
)
from ninfer.runtime.tokenizer import Tokenizer


@dataclass
class GenerationResult:
    """One prompt's output. `token_ids` are the generated tokens (including a final EOS, and
    up to the token that completed a stop string); `text` is their text without special tokens,
    cut before a matched stop string. `logprobs`: with `SamplingParams.logprobs` set, one
    `TokenLogprob` per token id (None for a token committed without sampling); else None."""

    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str  # "stop" (EOS or stop string) | "length"
    logprobs: list[TokenLogprob | None] | None = None


class LLM:
    """Loads `path` and starts an engine on it. Engine options are keywords named like the
    `ninfer serve` flags (max_context, prefill_chunk, kv_dtype, page_size, prefix_reuse,
    cuda_graphs, ...; EngineOptions). `dtype` not given: float32 on cpu, bfloat16 on cuda; given
    as "float32", a CPU plan computes in float32 throughout (GGUF weights dequantised at load
    unless `cpu_weights="packed"`). Unlike the server, a request waiting for a lane never times
    out unless `pending_timeout_ms` is given. Calls are serialised."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        device: str = "cpu",
        dtype: str | None = None,
        max_concurrency: int = 8,
        kv_capacity: int | str | None = 4096,
        **engine_options: Any,
    ):
        engine_options.setdefault("pending_timeout_ms", NO_TIMEOUT_MS)
        self.options = EngineOptions.of(
            device=device,
            dtype=dtype,
            max_concurrency=max_concurrency,
            kv_capacity=parse_kv_capacity(kv_capacity),
            **engine_options,
        )
        self.artifact = Artifact(path)
        self.tokenizer = Tokenizer(self.artifact.tokenizer_json, self.artifact.special_tokens)
        self.engine: Engine = build_engine(self.artifact, self.options)
        self.plan = self.engine.plan
        self.executor = self.engine.executor
        # the engine's worker stops when this LLM is collected, or at interpreter exit
        self._finalizer = weakref.finalize(self, self.engine.close)
        self._template: Any = None  # the chat template, loaded by the first `chat`
        self._lock = threading.Lock()  # one call at a time: results come back in call order

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """The ids that end a generation (unless ignore_eos): the engine's, as the server's."""
        return self.engine.eos_ids

    def close(self) -> None:
        """Stop the engine (its worker thread); the LLM cannot be used afterwards."""
        self._finalizer()

    # -- logits ------------------------------------------------------------------------------
    def logits(self, token_ids: Sequence[int], media: Sequence[MediaSpan] = ()) -> Any:
        """float32 logits [len(token_ids), vocab] of every position, from one prefill (a torch
        tensor on the engine's device); `media`: the prompt's images and videos (Request.media,
        needs vision=True)."""
        ids = self._check_ids(list(token_ids))
        with self._lock:
            return self.engine.prompt_logits(ids, tuple(media)).result()

    # -- generate ----------------------------------------------------------------------------
    def generate(
        self,
        prompts: Sequence[str] | Sequence[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[GenerationResult]:
        """One result per prompt, in order. Prompts are strings (encoded with the artifact's
        tokenizer) or lists of token ids. Stops on EOS (unless ignore_eos), a stop string, or
        max_tokens (default: the engine's default output limit, within max_context and the KV
        cache). `params` None: the sampling defaults the artifact records (`ninfer inspect`
        shows them), as the server applies to a request that leaves them out. Raises
        RequestError for a prompt the engine can never serve."""
        if isinstance(prompts, (str, bytes)) or (prompts and isinstance(prompts[0], int)):
            raise TypeError("generate takes a list of prompts: ['text'] or [[1, 2, 3]]")
        ids = [
            self._check_ids(self.tokenizer.encode(p) if isinstance(p, str) else list(p))
            for p in prompts
        ]
        return self._run(ids, self._params(params, len(ids)))

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]] | Sequence[Sequence[Mapping[str, Any]]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
    ) -> list[GenerationResult]:
        """Generate the assistant's reply to one conversation (a list of {"role", "content"}
        messages) or to each of a list of conversations, as vLLM's `LLM.chat`: the messages are
        rendered with the artifact's chat template (the server's renderer: the same prompt
        tokens a Chat Completions request gets) and generated as `generate` does. `tools`
        are OpenAI-style function definitions; `chat_template_kwargs` template variables
        (e.g. {"enable_thinking": False}). One result per conversation."""
        from ninfer.api.service.prompt_encoding import PromptEncoder
        from ninfer.api.service.template import artifact_template
        from ninfer.api.service.template_options import resolve_template_options

        if isinstance(messages, Mapping) or not messages:
            raise TypeError("chat takes a list of messages, or a list of such lists")
        conversations = [messages] if isinstance(messages[0], Mapping) else list(messages)
        if self._template is None:
            hf = self.tokenizer.hf
            template = artifact_template(self.artifact, hf)
            self._template = (template, PromptEncoder(hf, template.control_tokens))
        template, encoder = self._template
        options = resolve_template_options(chat_template_kwargs=chat_template_kwargs)
        ids = []
        for conversation in conversations:
            rendered = template.render(
                list(conversation),
                tools=list(tools) if tools else None,
                add_generation_prompt=add_generation_prompt and not continue_final_message,
                continue_final_message=continue_final_message,
                options=options,
            )
            ids.append(self._check_ids(encoder.encode(rendered.text, rendered.special_spans)))
        return self._run(ids, self._params(params, len(ids)))

    # -- the client side of the engine --------------------------------------------------------
    def _params(
        self, params: SamplingParams | Sequence[SamplingParams] | None, n: int
    ) -> list[SamplingParams]:
        # no params: the sampling defaults the artifact records (as the server uses for a
        # request that leaves them out), then max_tokens from the engine's output limit
        default = params or SamplingParams(**artifact_defaults(self.artifact))
        plist = list(params) if isinstance(params, (list, tuple)) else [default] * n
        if len(plist) != n:
            raise ValueError(f"{n} prompts but {len(plist)} SamplingParams")
        return plist

    def _check_ids(self, ids: list[Any]) -> list[int]:
        if not ids:
            raise RequestError("empty prompt")
        vocab = self.executor.vocab_size
        try:  # numpy / torch integers too, as plain ints; no floats or bools
            if any(isinstance(t, bool) for t in ids):
                raise TypeError
            ids = [operator.index(t) for t in ids]
        except TypeError:
            raise RequestError(f"token ids must be integers, got {ids!r:.80}") from None
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise RequestError(f"token id {bad[0]} is outside the vocabulary (0..{vocab - 1})")
        return ids

    def _request(self, i: int, ids: list[int], params: SamplingParams) -> Request:
        """The engine request of prompt `i`, its output limit resolved as the server resolves
        it; an explicit max_tokens the KV cache can never hold is refused."""
        limit = self.engine.output_limit(len(ids), params.max_tokens)
        pages = self.executor.num_pages
        page = self.executor.page_size
        if params.max_tokens is not None and len(ids) + params.max_tokens > pages * page:
            need = -(-(len(ids) + params.max_tokens) // page)
            raise RequestError(
                f"prompt {i} needs {need} KV pages for {len(ids)} + {params.max_tokens} tokens, "
                f"the cache has {pages}; raise kv_capacity or lower max_tokens"
            )
        if len(ids) >= min(self.options.max_context, pages * page):
            raise RequestError(
                f"prompt {i} has {len(ids)} tokens, the context holds "
                f"{min(self.options.max_context, pages * page)} (max_context, kv_capacity)"
            )
        sampling = dataclasses.replace(params, max_tokens=limit.max_tokens)
        return Request(tuple(ids), sampling, session_key=None)

    def _run(self, prompts: list[list[int]], plist: list[SamplingParams]) -> list[GenerationResult]:
        """Submit the requests in order, at most as many outstanding as the engine accepts
        (the next goes in as soon as one finishes); one thread per outstanding request follows
        its events. An exception (Ctrl-C included) cancels every request of the call."""
        requests = [self._request(i, ids, p) for i, (ids, p) in enumerate(zip(prompts, plist))]
        capacity = self.options.max_concurrency + self.options.max_pending_requests
        results: list[GenerationResult | None] = [None] * len(requests)
        done: queue.Queue[tuple[int, GenerationResult | None, BaseException | None]]
        done = queue.Queue()

        def follow(i: int, handle: RequestHandle) -> None:
            try:
                done.put((i, self._follow(handle, requests[i]), None))
            except BaseException as e:  # noqa: BLE001 - handed to the calling thread
                done.put((i, None, e))

        with self._lock, concurrent.futures.ThreadPoolExecutor(capacity) as pool:
            handles: list[RequestHandle] = []
            try:
                waiting, live = collections.deque(range(len(requests))), 0
                while waiting or live:
                    while waiting and live < capacity:
                        i = waiting.popleft()
                        handles.append(self.engine.submit(requests[i]))
                        pool.submit(follow, i, handles[-1])
                        live += 1
                    i, result, error = done.get()
                    live -= 1
                    if error is not None:
                        raise error
                    results[i] = result
            except BaseException:
                for h in handles:  # an interrupted call leaves nothing running
                    h.cancel()
                for h in handles:
                    with contextlib.suppress(Exception):  # their own failures are not this one
                        h.result(timeout=60)
                raise
        return [r for r in results if r is not None]

    def _follow(self, handle: RequestHandle, request: Request) -> GenerationResult:
        """Read one request's events to its end, its text through the server's `OutputText`
        (EOS withheld, stop strings matched on the detokenized stream): at a match the engine
        is told to stop, and the ids are kept up to the token that completed it."""
        params = request.sampling
        out = OutputText(
            self.tokenizer.hf,
            eos_ids=self.engine.eos_ids,
            ignore_eos=params.ignore_eos,
            stops=params.stop,
        )
        text: list[str] = []
        logprobs: list[TokenLogprob | None] | None = None if params.logprobs is None else []
        finish: FinishEvent | None = None
        stopping = False
        for event in handle:
            if isinstance(event, TokensEvent):
                if logprobs is not None:
                    logprobs += event.logprobs or (None,) * len(event.token_ids)
                for tid in event.token_ids:
                    if out.stop_match is not None:
                        break
                    text.append(out.add(tid))
                if out.stop_match is not None and not stopping:
                    self.engine.finish(handle, "stop", keep_tokens=out.kept_tokens)
                    stopping = True
            elif isinstance(event, FinishEvent):
                finish = event
        assert finish is not None, "a request's events end with its FinishEvent"
        if finish.error is not None:
            raise finish.error
        text.append(out.finish())
        matched = out.stop_match is not None
        if finish.reason == "cancelled" and not matched:
            raise EngineError("the engine stopped before the request finished")
        token_ids = list(finish.token_ids)
        if matched:
            token_ids, reason, result = token_ids[: out.kept_tokens], "stop", "".join(text)
        else:  # the whole decode (the stream's pieces differ only around invalid bytes)
            reason = "stop" if finish.reason == "stop" else "length"
            result = self.tokenizer.decode(token_ids)
        if logprobs is not None:
            logprobs = logprobs[: len(token_ids)]
        return GenerationResult(list(request.prompt_token_ids), token_ids, result, reason, logprobs)
