"""`ninfer.LLM`: the offline Python API (DESIGN.md "Python").

    llm = LLM("model.ninfer", device="cpu", dtype="float32", max_concurrency=8, kv_capacity=4096)
    out = llm.generate(["Hello"], SamplingParams(max_tokens=16, temperature=0.0))
    out[0].token_ids, out[0].text
    logits = llm.logits(token_ids)       # [len(token_ids), vocab] from one prefill

It compiles the artifact, loads the reference executor and drives it with a small loop of its
own: up to max_concurrency sequences run together; prefill is chunked (`prefill_chunk` tokens
per step across sequences) and mixed with decode rows of the others; each sequence reserves
the KV pages of its whole budget (prompt + max_tokens) when it is admitted. Sampling uses the
engine's Sampler, so seeds mean the same thing as over HTTP.
"""

from __future__ import annotations

import math
import operator
import os
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ninfer.artifact.format import Artifact
from ninfer.errors import ConfigError
from ninfer.passes.options import CompileOptions, parse_kv_capacity
from ninfer.passes.pipeline import compile_artifact
from ninfer.runtime.executors import make_executor
from ninfer.runtime.request import RequestError, SamplingParams
from ninfer.runtime.sampler import Sampler, SampleRow
from ninfer.runtime.step import SeqChunk, StepBatch
from ninfer.runtime.tokenizer import Tokenizer

# keyword engine options LLM understands (named like the serve flags)
ENGINE_OPTIONS = (
    "max_context",
    "prefill_chunk",
    "kv_dtype",
    "page_size",
    "device_state_slots",
    "cuda_graphs",
    "device_memory",
    "cpu_weights",
)


@dataclass
class GenerationResult:
    """One prompt's output. `token_ids` are the generated tokens (including a final EOS);
    `text` decodes them without special tokens and is cut before a matched stop string."""

    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str  # "stop" (EOS or stop string) | "length"


@dataclass
class _Seq:
    index: int
    prompt: list[int]
    params: SamplingParams
    max_tokens: int
    output: list[int] = field(default_factory=list)
    computed: int = 0  # tokens whose KV is written
    pages: list[int] = field(default_factory=list)
    slot: int | None = None
    finish: str | None = None
    text: str = ""

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output


class LLM:
    def __init__(
        self,
        path: str | os.PathLike[str],
        device: str = "cpu",
        dtype: str = "float32",
        max_concurrency: int = 8,
        kv_capacity: int | str | None = 4096,
        **engine_options: Any,
    ):
        unknown = sorted(set(engine_options) - set(ENGINE_OPTIONS))
        if unknown:
            raise ConfigError(
                f"LLM: unknown engine option(s) {', '.join(unknown)} (known: {', '.join(ENGINE_OPTIONS)})"
            )
        self.artifact = Artifact(path)
        opts = dict(engine_options)
        opts.setdefault("max_context", 8192)
        self.options = CompileOptions(
            device=device,
            dtype=dtype,
            max_concurrency=max_concurrency,
            kv_capacity=parse_kv_capacity(kv_capacity),
            **opts,
        )
        self.plan = compile_artifact(self.artifact, self.options)
        self.executor = make_executor(self.plan, self.artifact, device)
        self.tokenizer = Tokenizer(self.artifact.tokenizer_json, self.artifact.special_tokens)
        self.eos_token_ids = set(self.tokenizer.eos_token_ids)
        self._sampler = Sampler()
        self._lock = threading.Lock()  # one call at a time: calls share the KV pages and RNGs

    # -- logits ------------------------------------------------------------------------------
    def logits(self, token_ids: Sequence[int]) -> torch.Tensor:
        """float32 logits [len(token_ids), vocab] of every position, from one prefill."""
        ids = self._check_ids(list(token_ids))
        pages = math.ceil(len(ids) / self.executor.page_size)
        if pages > self.executor.num_pages:
            raise RequestError(
                f"{len(ids)} tokens need {pages} KV pages, the cache has {self.executor.num_pages}"
            )
        slot = 0 if self.executor.is_hybrid else None
        chunk = SeqChunk(0, tuple(ids), 0, tuple(range(pages)), slot)
        with self._lock:
            return self.executor.run(StepBatch((chunk,)), all_logits=True)

    # -- generate ----------------------------------------------------------------------------
    def generate(
        self,
        prompts: Sequence[str] | Sequence[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[GenerationResult]:
        """One result per prompt, in order. Prompts are strings (encoded with the artifact's
        tokenizer) or lists of token ids. Stops on EOS (unless ignore_eos), a stop string, or
        max_tokens (default: whatever fits in max_context and the KV cache)."""
        if isinstance(prompts, (str, bytes)) or (prompts and isinstance(prompts[0], int)):
            raise TypeError("generate takes a list of prompts: ['text'] or [[1, 2, 3]]")
        plist = (
            list(params)
            if isinstance(params, (list, tuple))
            else [params or SamplingParams()] * len(prompts)
        )
        if len(plist) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(plist)} SamplingParams")
        seqs = []
        cache_tokens = self.executor.num_pages * self.executor.page_size
        for i, (p, sp) in enumerate(zip(prompts, plist)):
            ids = self._check_ids(self.tokenizer.encode(p) if isinstance(p, str) else list(p))
            room = self.options.max_context - len(ids)
            if room < 1:
                raise RequestError(
                    f"prompt {i} has {len(ids)} tokens, max_context is {self.options.max_context}"
                )
            default = min(room, max(cache_tokens - len(ids), 1))  # too long: _loop says so
            seqs.append(_Seq(i, ids, sp, min(sp.max_tokens or default, room)))
        with self._lock:
            self._sampler = Sampler()  # a call's seeds never see a failed call's generators
            self._loop(seqs)
        return [GenerationResult(s.prompt, s.output, s.text, s.finish or "length") for s in seqs]

    def _check_ids(self, ids: list[int]) -> list[int]:
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

    def _loop(self, seqs: list[_Seq]) -> None:
        ex, page = self.executor, self.executor.page_size
        free_pages = deque(range(ex.num_pages))
        free_slots = deque(range(self.options.max_concurrency))
        waiting, active = deque(seqs), []
        for s in seqs:
            need = math.ceil((len(s.prompt) + s.max_tokens) / page)
            if need > ex.num_pages:
                raise RequestError(
                    f"prompt {s.index} needs {need} KV pages for {len(s.prompt)} + {s.max_tokens} tokens, "
                    f"the cache has {ex.num_pages}; raise kv_capacity or lower max_tokens"
                )
        while waiting or active:
            while waiting and free_slots:
                s = waiting[0]
                need = math.ceil((len(s.prompt) + s.max_tokens) / page)
                if need > len(free_pages):
                    break
                waiting.popleft()
                s.pages = [free_pages.popleft() for _ in range(need)]
                s.slot = free_slots.popleft()
                active.append(s)
            chunks, budget = [], self.options.chunk_tokens
            for s in active:
                todo = s.tokens[s.computed :]
                if len(todo) > 1 and budget <= 0:
                    continue  # prefill waits for the next step
                n = len(todo) if len(todo) == 1 else min(len(todo), budget)
                budget -= n if len(todo) > 1 else 0
                last = s.computed + n == len(s.tokens)
                slot = s.slot if ex.is_hybrid else None
                chunks.append(
                    (s, SeqChunk(s.index, tuple(todo[:n]), s.computed, tuple(s.pages), slot, last))
                )
            logits = ex.run(StepBatch(tuple(c for _, c in chunks)))
            rows = [(s, c) for s, c in chunks if c.want_logits]
            for s, c in chunks:
                s.computed += len(c.token_ids)
            sampled = self._sampler.sample(
                logits, [SampleRow(s.index, s.params, s.output) for s, _ in rows]
            )
            for (s, _), tok in zip(rows, sampled):
                self._append(s, tok)
            for s in [s for s in active if s.finish]:
                active.remove(s)
                free_pages.extend(s.pages)
                free_slots.append(s.slot)  # type: ignore[arg-type]
                self._sampler.forget(s.index)

    def _append(self, s: _Seq, tok: int) -> None:
        s.output.append(tok)
        s.text = self.tokenizer.decode(s.output)
        if tok in self.eos_token_ids and not s.params.ignore_eos:
            s.finish = "stop"
        for stop in s.params.stop:
            at = s.text.find(stop)
            if at >= 0:
                s.text, s.finish = s.text[:at], "stop"
        if s.finish is None and len(s.output) >= s.max_tokens:
            s.finish = "length"
