"""Post-processing of one generation: engine token ids to protocol-free text events.

    token ids ─detokenize─▶ text ─stop strings─▶ ─reasoning split─▶ ─tool calls─▶ events

`PostProcessor` is driven by ModelService (ninfer.api.service.model_service) for each request: `tokens` per
engine TokensEvent, `finish` and `finished` at the engine's FinishEvent.
"""

from __future__ import annotations

import time

from tokenizers import Tokenizer

from ninfer.api.service import toolcalls
from ninfer.api.service.generation import (
    ContentText,
    Finished,
    GenerationEvent,
    GenerationRequest,
    ReasoningText,
    Timings,
    ToolCallArgs,
    ToolCallDone,
    ToolCallStart,
    Usage,
)
from ninfer.api.service.logprob_entries import ContentLogprobs, EntryFormatter
from ninfer.api.service.output_text import OutputText
from ninfer.api.service.reasoning import ReasoningParser
from ninfer.api.service.toolcalls_json import ToolCallFormat, tool_call_parser
from ninfer.runtime.request import FinishEvent, TokenLogprob


class PostProcessor:
    """Token ids → stop-filtered, reasoning-split, tool-parsed text events (one request).

    `tokenizer` detokenizes; `eos_ids` are withheld from the text (unless the request ignores
    EOS); `prompt_len` tokens were prompted, starting in thinking when `starts_in_thinking`;
    `t_submit` is the monotonic submission time. The caller sets `t_admit` and `cached` when the
    engine admits the request, and reads `stop_match`, `finish_sent` and `kept_tokens` to end a
    generation at a stop string. With `req.logprobs` set, `entries` formats the answer tokens'
    log probabilities, which ContentText events and Finished carry (logprob_entries.py).
    `tool_call_format`: the calls the chat template teaches, "xml" (Qwen) or "json" (Hermes)."""

    def __init__(
        self,
        req: GenerationRequest,
        *,
        tokenizer: Tokenizer,
        eos_ids: frozenset[int],
        prompt_len: int,
        starts_in_thinking: bool,
        t_submit: float,
        entries: EntryFormatter | None = None,
        tool_call_format: ToolCallFormat = "xml",
    ) -> None:
        self.eos_ids = eos_ids
        self.prompt_len = prompt_len
        self.t_submit = t_submit
        self.t_admit: float | None = None  # when the engine's AdmittedEvent arrived
        self.t_first: float | None = None
        self.t_last: float | None = None
        # the engine's cumulative prompt / generation seconds at the latest committed token
        self.engine_times: tuple[float, float] | None = None
        self.cached = 0  # exact reused prompt tokens, from the AdmittedEvent
        self.text = OutputText(
            tokenizer, eos_ids=eos_ids, ignore_eos=req.ignore_eos, stops=req.stop
        )
        self.reasoning = ReasoningParser(starts_in_thinking)
        callable_tools = req.tools if req.callable_tools is None else req.callable_tools
        self.tools = (
            tool_call_parser(tool_call_format, callable_tools)
            if req.tools and callable_tools and req.parse_tools
            else None
        )
        self.logprobs = (
            ContentLogprobs(entries or EntryFormatter(tokenizer))
            if req.logprobs is not None
            else None
        )
        self.finish_sent = False
        self.reasoning_tokens = 0
        self.content = []
        self.reasoning_text = []
        self.calls: list[toolcalls.ToolCall] = []

    def tokens(
        self,
        ids: tuple[int, ...],
        prompt_s: float | None = None,
        decode_s: float | None = None,
        logprobs: tuple[TokenLogprob | None, ...] | None = None,
    ) -> list[GenerationEvent]:
        """Text events of newly committed ids; `prompt_s` / `decode_s` the engine's cumulative
        timings at the last of them, `logprobs` their entries (TokensEvent)."""
        out: list[GenerationEvent] = []
        if prompt_s is not None and decode_s is not None:
            self.engine_times = (prompt_s, decode_s)
        now = time.monotonic()
        if self.t_first is None and ids:
            self.t_first = now
        self.t_last = now
        for i, tid in enumerate(ids):
            if self.stop_match is not None:
                break
            thinking = self.reasoning.in_reasoning
            if thinking:
                self.reasoning_tokens += 1
            before = self.text.raw_chars
            events = self._parse(self.text.add(tid))
            if self.logprobs is not None:
                answer = not (thinking or self.reasoning.in_reasoning) and not (
                    tid in self.eos_ids and not self.text.ignore_eos
                )
                lp = logprobs[i] if logprobs is not None else None
                self.logprobs.add(lp, self.text.raw_chars - before, answer)
                events = self._with_logprobs(events)
            out.extend(events)
        return out

    def _with_logprobs(self, events: list[GenerationEvent]) -> list[GenerationEvent]:
        """`events` with each content delta carrying the entries it completes."""
        assert self.logprobs is not None
        return [
            ContentText(e.text, e.timings, tuple(self.logprobs.release(e.text)))
            if isinstance(e, ContentText)
            else e
            for e in events
        ]

    @property
    def stop_match(self) -> str | None:
        """The stop string the output ended at, once one completed."""
        return self.text.stop_match

    @property
    def kept_tokens(self) -> int:
        """Output ids accepted so far (up to the one that completed a stop string)."""
        return self.text.kept_tokens

    def _parse(self, text: str) -> list[GenerationEvent]:
        if not text:
            return []
        delta = self.reasoning.feed(text)
        return self._split(delta.reasoning, delta.content)

    def _split(self, reasoning: str, content: str) -> list[GenerationEvent]:
        out: list[GenerationEvent] = []
        if reasoning:
            self.reasoning_text.append(reasoning)
            out.append(ReasoningText(reasoning, self.snapshot()))
        if content:
            out.extend(
                self._content(
                    self.tools.feed(content) if self.tools else [toolcalls.ContentDelta(content)]
                )
            )
        return out

    def _content(self, events: list[toolcalls.ToolEvent]) -> list[GenerationEvent]:
        out: list[GenerationEvent] = []
        for e in events:
            if isinstance(e, toolcalls.ContentDelta):
                if e.text:
                    self.content.append(e.text)
                    out.append(ContentText(e.text, self.snapshot()))
            elif isinstance(e, (ToolCallStart, ToolCallArgs, ToolCallDone)):
                # the parser's tool-call events are generation events as they are
                if isinstance(e, ToolCallDone):
                    self.calls.append(e.call)
                out.append(e)
        return out

    def finish(self) -> list[GenerationEvent]:
        out = self._parse(self.text.finish())
        tail = self.reasoning.finish()
        out.extend(self._split(tail.reasoning, tail.content))
        if self.tools is not None:
            out.extend(self._content(self.tools.finish()))
        if self.logprobs is not None:
            out = self._with_logprobs(out)
            rest = self.logprobs.finish(tool_calls=bool(self.calls))
            if rest:
                out.append(ContentText("", self.snapshot(), tuple(rest)))
        return out

    def snapshot(self) -> Timings:
        """Cumulative timings at the committed frontier (timings_per_token): the engine's clock,
        as the terminal timings (arrival times here when the engine gave none)."""
        if self.engine_times is not None:
            prompt_s, decode_s = self.engine_times
            return Timings(
                self.cached,
                self.prompt_len - self.cached,
                prompt_s * 1000.0,
                self.kept_tokens,
                decode_s * 1000.0,
            )
        first, last = self.t_first, self.t_last
        start = (
            self.t_submit if self.t_admit is None else self.t_admit
        )  # prompt time starts at admission
        prompt_ms = 0.0 if first is None else (first - start) * 1000.0
        predicted_ms = 0.0 if first is None or last is None else (last - first) * 1000.0
        return Timings(
            self.cached, self.prompt_len - self.cached, prompt_ms, self.kept_tokens, predicted_ms
        )

    def finished(self, event: FinishEvent, length_cause: str, prompt_only: bool) -> Finished:
        u, t = event.usage, event.timings
        completion = 0 if prompt_only else u.completion_tokens
        token_ids = tuple(event.token_ids)
        if self.stop_match is not None:
            reason = "stop"
            # the output ends at the stop string: tokens the engine committed after it (it may
            # have finished before our finish(keep_tokens) reached it) are not accepted output
            completion = min(completion, self.kept_tokens)
            token_ids = token_ids[: self.kept_tokens]
        elif event.reason == "length" or prompt_only:
            reason = "length"
        elif event.reason == "stop":
            reason = "tool_calls" if self.calls else "stop"
        else:
            reason = event.reason
        prompt_ms = (t.prefill_s or 0.0) * 1000.0
        predicted_ms = (t.decode_s or 0.0) * 1000.0
        spec = getattr(t, "speculative", None)  # draft work: llama.cpp's draft_n fields
        drafted = spec["drafted_tokens"] if spec and spec["drafted_tokens"] else None
        accepted = spec["accepted_tokens"] if drafted is not None else None
        return Finished(
            reason=reason,
            content="".join(self.content),
            reasoning="".join(self.reasoning_text),
            tool_calls=tuple(self.calls),
            usage=Usage(
                u.prompt_tokens, completion, u.cached_tokens, min(self.reasoning_tokens, completion)
            ),
            timings=Timings(
                u.cached_tokens,
                u.prompt_tokens - u.cached_tokens,
                prompt_ms,
                completion,
                predicted_ms,
                drafted,
                accepted,
            ),
            stop_sequence=self.stop_match,
            length_cause=length_cause if reason == "length" else None,
            tool_parse=(
                self.tools.stats if self.tools else toolcalls.unparsed_stats("".join(self.content))
            ).as_dict(),
            generated_token_ids=token_ids,
            error=event.error,
            logprobs=None if self.logprobs is None else tuple(self.logprobs.entries),
        )
