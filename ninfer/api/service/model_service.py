"""The model service: from a protocol-free `GenerationRequest` to a stream of text events.

    GenerationRequest ─render─▶ prompt text ─encode─▶ ids ─submit─▶ Engine
    Engine tokens ─detokenize─▶ text ─stop strings─▶ ─reasoning split─▶ ─tool calls─▶ events

All protocol handlers (Chat Completions, Responses, Anthropic) share this path, so prompt
rendering, sampling defaults, stop handling, usage and timings mean the same everywhere. It
runs on the HTTP event loop; the engine's worker thread does the model work.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import secrets
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from tokenizers import Tokenizer

from ninfer.api.service.body_screen import BodyScreen, ProtocolFn, screened_refusal
from ninfer.api.service.choice_group import Choice
from ninfer.api.service.generation import (
    Admitted,
    Finished,
    GenerationEvent,
    GenerationRequest,
    PromptProgress,
)
from ninfer.api.service.logprob_entries import EntryFormatter
from ninfer.api.service.media_path import MediaPath, release
from ninfer.api.service.media_prompt import split_media
from ninfer.api.service.observe import NO_TRACK, Observer, RequestTrack
from ninfer.api.service.output_constraints import constraint_error
from ninfer.api.service.postprocess import PostProcessor
from ninfer.api.service.prompt_encoding import PromptEncoder
from ninfer.api.service.prompt_prep import Prepared, prepare_prompt
from ninfer.api.service.reasoning import (
    THINK_CLOSE,
    resolve_thinking_budget,
    thinking_budget_suffix_ids,
)
from ninfer.api.service.sampling import FIELDS, SamplerDefaults, SamplerPolicy
from ninfer.api.service.template import ChatTemplate
from ninfer.api.wire import errors
from ninfer.api.wire.errors import ApiError
from ninfer.api.wire.offload import gc_paused
from ninfer.constrain import (
    Constraint,
    ConstraintError,
    ConstraintSpec,
    ForcedToolCall,
    StrictTools,
    TokenizerInfo,
    compile_constraint,
)
from ninfer.media.preparer import PreparedItem
from ninfer.runtime.request import (
    AdmittedEvent,
    EngineError,
    EngineOverloaded,
    FinishEvent,
    PromptProgressEvent,
    QueueTimeout,
    Request,
    RequestError,
    SamplingParams,
    SchedulingEvent,
    TokensEvent,
)


class ModelService:
    """Renders, tokenises, submits and post-processes generations for every protocol.

    `engine`: ninfer.runtime.engine.Engine. `tokenizer`: the artifact's `tokenizers.Tokenizer`.
    `template`: the ChatTemplate in use. `eos_ids`: ids that end a turn (withheld from text).
    `media`: the --vision media path (None: media parts were refused by the protocol parsers).
    `tokenizer_info`: builds the grammar engine's view of the vocabulary (called once, at the
    first constrained request; None: constrained requests are refused).
    """

    def __init__(
        self,
        *,
        engine: Any,
        tokenizer: Tokenizer,
        template: ChatTemplate,
        eos_ids: tuple[int, ...],
        max_context: int,
        sampler_defaults: SamplerDefaults | None = None,
        sampler_policy: SamplerPolicy | None = None,
        default_thinking_budget: int | None = None,
        observer: Observer | None = None,
        media: MediaPath | None = None,
        tokenizer_info: Callable[[], TokenizerInfo] | None = None,
    ) -> None:
        self.engine = engine
        self.media = media
        self._tokenizer_info = tokenizer_info
        self._info: TokenizerInfo | None = None
        self._info_lock = threading.Lock()
        self.observer = observer  # request lifecycle records (metrics, request log, stderr)
        self.tokenizer = tokenizer
        self.template = template
        self.encoder = PromptEncoder(tokenizer, template.control_tokens)
        self.eos_ids = frozenset(eos_ids)
        self.max_context = max_context
        # large bodies screened in a worker process (set by `ninfer serve`; None: not screened)
        self.body_screen: BodyScreen | None = None
        sampler_defaults = sampler_defaults or SamplerDefaults()
        self.sampler_defaults = sampler_defaults
        self.sampler_policy = sampler_policy or SamplerPolicy(
            "",
            overrides={k: getattr(sampler_defaults, k) for k in (*FIELDS, "seed")},
            greedy=sampler_defaults.greedy,
        )
        self.default_thinking_budget = default_thinking_budget
        # generations alive from entry (before preparation) until their response is released:
        # the lifetime capacity is max_concurrency + max_pending_requests (docs/serving.md,
        # "Execution and capacity"); beyond it a new one gets 429 server_overloaded at once
        config = getattr(engine, "config", None)
        self.capacity: int | None = (
            config.max_concurrency + config.max_pending_requests if config is not None else None
        )
        self.alive = 0
        # engine requests running now, and the error that ends them when the server shuts down
        self._running: set[Any] = set()
        self.stopping: ApiError | None = None

    # -- preparation ---------------------------------------------------------------------------

    def prepare(self, req: GenerationRequest, media: Sequence[PreparedItem] = ()) -> Prepared:
        """Render and encode the prompt, with `media` (the request's images and videos, from
        `prepare_media`) placed in it; raises ApiError (invalid_prompt, context_length_exceeded,
        media_budget_exceeded) when it cannot be served (ninfer.api.service.prompt_prep); a
        request parsed from a slim body raises the body-screening worker's refusal instead
        (ninfer.api.service.body_screen)."""
        refusal = screened_refusal(req)
        if refusal is not None:
            raise refusal
        return prepare_prompt(
            req,
            media,
            template=self.template,
            encoder=self.encoder,
            max_context=self.max_context,
            media_path=self.media,
        )

    def screen(self, fn: ProtocolFn) -> Callable[[bytes], Awaitable[bytes | None]] | None:
        """The `screen` for `decode_body` of a protocol whose request `fn` builds (None
        without a body-screening worker)."""
        return self.body_screen.bind(fn) if self.body_screen is not None else None

    async def prepare_media(self, req: GenerationRequest) -> list[PreparedItem]:
        """The request's images and videos prepared off the event loop, in prompt order ([]
        without media), each holding a cache reference: pass them to `prepare`, `release` them
        when the engine no longer reads the payloads. --pending-timeout-ms bounds the wait."""
        _, inputs = split_media(
            req.messages, "input" if req.protocol == "responses" else "messages"
        )
        if not inputs:
            return []
        if self.media is None:
            raise errors.vision_disabled(inputs[0].param)
        config = getattr(self.engine, "config", None)
        return await self.media.prepare(inputs, getattr(config, "pending_timeout_ms", 30000))

    async def count_prompt_tokens(self, req: GenerationRequest) -> int:
        """Prompt tokens of `req` with its media placed (token-count endpoints): the same path
        as a generation, without submitting anything."""
        media = await self.prepare_media(req)
        try:
            prepared = await asyncio.to_thread(self._prepare_quietly, req, media)
        finally:
            release(media)
        return len(prepared.prompt_ids)

    def _prepare_quietly(
        self, req: GenerationRequest, media: Sequence[PreparedItem] = ()
    ) -> Prepared:
        """`prepare` with garbage collection paused (ninfer.api.wire.offload.gc_paused): rendering a
        large conversation allocates enough to trigger full collections, each a long GIL hold."""
        with gc_paused():
            return self.prepare(req, media)

    def compile_constraint(self, spec: ConstraintSpec, thinking: bool) -> Constraint:
        """`spec` compiled for this model's vocabulary, gated until `</think>` when the output
        starts in thinking. Raises ApiError 400 invalid_schema naming the offending path. Blocks
        (the first call builds the token trie): run it off the event loop."""
        with self._info_lock:
            if self._info is None:
                if self._tokenizer_info is None:
                    raise errors.unsupported_parameter(
                        "response_format", "constrained decoding (no tokenizer information)"
                    )
                self._info = self._tokenizer_info()
        if isinstance(spec, (ForcedToolCall, StrictTools)):
            # calls in the form the chat template teaches, which the output parser reads
            spec = dataclasses.replace(spec, call_format=self.template.tool_call_format)
        try:
            constraint = compile_constraint(spec, self._info)
            return constraint.after_thinking() if thinking else constraint
        except ConstraintError as e:
            raise constraint_error(e) from None

    def sampling_params(
        self, req: GenerationRequest, max_tokens: int, thinking: bool = False
    ) -> SamplingParams:
        """The engine sampler for `req`: preset or artifact defaults for the resolved thinking
        mode, then process flags, then request fields, then --greedy (ninfer.api.service.sampling)."""
        fields = {name: getattr(req.sampling, name) for name in (*FIELDS, "seed")}
        r = self.sampler_policy.resolve(thinking, fields)
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=float(r["temperature"]),
            top_p=float(r["top_p"]),
            top_k=int(r["top_k"]),
            min_p=float(r["min_p"]),
            presence_penalty=float(r["presence_penalty"]),
            frequency_penalty=float(r["frequency_penalty"]),
            # a request without a seed gets a fresh one here, so the request log can record it
            seed=r["seed"] if r["seed"] is not None else secrets.randbits(63),
            ignore_eos=req.ignore_eos,
            logprobs=req.logprobs,
        )

    @functools.cached_property
    def logprob_entries(self) -> EntryFormatter:
        """The formatter of log-probability entries (token texts cached across requests)."""
        return EntryFormatter(self.tokenizer)

    @functools.cached_property
    def thinking_control_ids(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(close ids, suffix ids): the `</think>` control token (empty when the tokenizer has
        no single token for it) and the early-close guidance + `</think>` (reasoning.py)."""
        close = self.encoder.encode(THINK_CLOSE, ((0, len(THINK_CLOSE)),))
        suffix = thinking_budget_suffix_ids(self.tokenizer)
        return (tuple(close) if len(close) == 1 else ()), tuple(suffix)

    def thinking_fields(
        self, req: GenerationRequest, prepared: Prepared, capacity: int
    ) -> dict[str, Any]:
        """The engine Request's thinking-budget fields for a generation of at most `capacity`
        output tokens ({} when the prompt does not start in thinking or has no budget). Raises
        ApiError thinking_budget_capacity_insufficient when the capacity extends past the cap
        but cannot hold the whole suffix plus one token after it."""
        budget = resolve_thinking_budget(
            prepared.starts_in_thinking, req.thinking_budget, self.default_thinking_budget
        )
        if budget is None:
            return {}
        close, suffix = self.thinking_control_ids
        limit = "max_output_tokens" if req.protocol == "responses" else "max_tokens"
        if budget < capacity < budget + len(suffix) + 1:
            raise ApiError(
                400,
                f"the output capacity of {capacity} tokens passes the thinking budget of {budget} but cannot hold"
                f" the {len(suffix)}-token early-close suffix plus one answer token (needs {budget + len(suffix) + 1});"
                f" raise {limit} or lower the thinking budget",
                code="thinking_budget_capacity_insufficient",
                param=limit,
            )
        return {
            "thinking_budget": budget,
            "thinking_close_ids": close,
            "thinking_suffix_ids": suffix,
        }

    def stop_all(self) -> int:
        """End every running generation with 503 server_shutting_down (at the end of the
        shutdown grace period): their engine requests are cancelled, and each protocol turns the
        error into its final event (an error chunk, response.failed, an Anthropic error event)
        or, not yet streaming, an HTTP error. New requests after this are refused. Returns how
        many were running. Call on the event loop."""
        self.stopping = errors.server_shutting_down()
        for handle in list(self._running):
            self.engine.cancel(handle)
        return len(self._running)

    # -- generation ------------------------------------------------------------------------------

    async def generate(
        self,
        req: GenerationRequest,
        *,
        request_id: str = "",
        tracks: list[RequestTrack] | None = None,
        on_sampling: Callable[[SamplingParams], object] | None = None,
        choice: Choice | None = None,
    ) -> AsyncIterator[GenerationEvent]:
        """Run one generation (`choice`: one of several choices of the prompt, submitted with
        the others, choice_group.py). Preparation and admission failures raise ApiError before the first
        event; once `Admitted` is yielded, failures end the stream with Finished(reason=error).
        With an `observer`, the request's lifecycle is reported to it (ninfer.api.service.observe);
        closing this generator early cancels the generation. `tracks` receives the request's
        track, through which a handler reports a failure after the outcome (`RequestTrack.raised`:
        rendering, storage). `on_sampling` is called once, on the event loop, with the effective
        sampler as soon as preparation has resolved it (before submission), so that a protocol
        can echo the values actually used (Responses' temperature, top_p and penalties)."""
        track = self.observer.track(req, request_id) if self.observer is not None else NO_TRACK
        if tracks is not None:
            tracks.append(track)
        if self.stopping is not None:
            track.raised(self.stopping)
            raise self.stopping
        if self.capacity is not None and self.alive >= self.capacity:
            full = errors.server_overloaded()
            track.raised(full)
            raise full
        self.alive += 1  # on the event loop: no other thread counts
        events = self._generate(req, track, on_sampling, choice)
        try:
            async for event in events:
                if isinstance(event, Finished):
                    track.finished(event)
                yield event
        except BaseException as e:
            track.raised(e)
            raise
        finally:
            self.alive -= 1
            await events.aclose()

    async def _generate(
        self,
        req: GenerationRequest,
        track: RequestTrack,
        on_sampling: Callable[[SamplingParams], object] | None = None,
        choice: Choice | None = None,
    ) -> AsyncIterator[GenerationEvent]:
        t_prepare = time.monotonic()  # the pending timeout counts from here
        media = await self.prepare_media(req)
        try:  # the payloads stay referenced until the engine is done with the request
            events = self._run(req, track, on_sampling, t_prepare, media, choice)
            async with contextlib.aclosing(events):
                async for event in events:
                    yield event
        finally:
            release(media)

    async def _run(
        self,
        req: GenerationRequest,
        track: RequestTrack,
        on_sampling: Callable[[SamplingParams], object] | None,
        t_prepare: float,
        media: Sequence[PreparedItem],
        choice: Choice | None,
    ) -> AsyncIterator[GenerationEvent]:
        prepared = await asyncio.to_thread(self._prepare_quietly, req, media)
        prompt_len = len(prepared.prompt_ids)
        prompt_only = req.max_tokens == 0
        max_tokens, length_cause = self.engine.output_limit(prompt_len, req.max_tokens)
        thinking = {} if prompt_only else self.thinking_fields(req, prepared, max_tokens)
        constraint = None
        if req.constraint is not None and not prompt_only:
            constraint = await asyncio.to_thread(
                self.compile_constraint, req.constraint, prepared.starts_in_thinking
            )
        try:
            sampling = self.sampling_params(req, max_tokens, prepared.starts_in_thinking)
            if on_sampling is not None:
                on_sampling(sampling)
            request = Request(
                tuple(prepared.prompt_ids),
                sampling,
                checkpoint_positions=prepared.checkpoint_positions,
                session_key=req.session_key,
                arrival_s=time.monotonic(),
                prepared_from_s=t_prepare,
                prompt_only=prompt_only,  # max_tokens 0: prompt processing, no output token
                media=prepared.media,
                constraint=constraint,
                **thinking,
            )
            if choice is None:
                handle = self.engine.submit(request)
            else:
                handle = await choice.submit(self.engine, request)
        except EngineOverloaded as e:
            raise ApiError(429, str(e), type=errors.RATE_LIMIT, code="server_overloaded") from None
        except RequestError as e:
            raise ApiError(400, str(e), code="invalid_request") from None
        except EngineError as e:
            raise ApiError(
                503,
                f"the engine is unavailable: {e}",
                type=errors.SERVER_ERROR,
                code="engine_unavailable",
            ) from None
        track.started(prepared, request)
        if prepared.media and self.media is not None:
            self.media.counters.placed(sum(s.tokens for s in prepared.media))
        self._running.add(handle)

        post = PostProcessor(
            req,
            tokenizer=self.tokenizer,
            eos_ids=self.eos_ids,
            prompt_len=prompt_len,
            starts_in_thinking=prepared.starts_in_thinking,
            t_submit=time.monotonic(),
            entries=self.logprob_entries if req.logprobs is not None else None,
            tool_call_format=self.template.tool_call_format,
        )
        admitted = first_token = False
        try:
            async for event in handle:
                if isinstance(event, AdmittedEvent):  # the exact reused prefix is committed
                    admitted = True
                    track.admitted()
                    post.t_admit, post.cached = time.monotonic(), event.cached_tokens
                    yield Admitted(event.prompt_tokens, event.cached_tokens, event.reuse_path)
                    yield PromptProgress(
                        event.prompt_tokens, event.cached_tokens, event.cached_tokens, 0.0
                    )
                elif isinstance(event, SchedulingEvent):
                    track.scheduling(event)
                elif isinstance(event, PromptProgressEvent):
                    yield PromptProgress(
                        event.total, event.cache, event.processed, event.elapsed_s * 1000.0
                    )
                elif isinstance(event, TokensEvent):
                    if not first_token:
                        first_token = True
                        track.first_token()
                    for out in post.tokens(
                        event.token_ids, event.prompt_s, event.decode_s, event.logprobs
                    ):
                        yield out
                    if post.stop_match is not None and not post.finish_sent:
                        post.finish_sent = True
                        self.engine.finish(handle, "stop", keep_tokens=post.kept_tokens)
                elif isinstance(event, FinishEvent):
                    track.engine_finished(event)
                    if not admitted:
                        if isinstance(event.error, QueueTimeout):
                            raise ApiError(
                                503,
                                str(event.error),
                                type=errors.SERVER_ERROR,
                                code="request_queue_timeout",
                            )
                        if event.reason == "error":
                            raise ApiError(
                                500,
                                f"generation failed: {event.error}",
                                type=errors.SERVER_ERROR,
                                code="engine_error",
                            )
                        yield Admitted(
                            prompt_len, event.usage.cached_tokens, event.usage.reuse_path
                        )
                    for out in post.finish():
                        yield out
                    finished = post.finished(event, length_cause, prompt_only)
                    if event.reason == "cancelled" and self.stopping is not None:
                        # cancelled by the shutdown, not by its client: say so
                        finished = dataclasses.replace(
                            finished, reason="error", error=self.stopping
                        )
                    yield finished
                    return
        finally:
            self._running.discard(handle)
            if not handle.finished:
                self.engine.cancel(handle)
