"""`--spec mtp`: the artifact's MTP head proposes the drafts from the target's hidden states.

The head (ir/models/mtp.py) runs as its own plan on its own executor and KV pages (allocated
here from its own page pool). Position p of the head reads the target's hidden after the final
norm at p and the embedding of token p + 1, and predicts token p + 2::

    target computed positions 0 .. n-1 (tokens[n] is the token it computes next)
    head step 1    positions f .. n-1: (h_target[p], tokens[p+1])   -> d1 (from position n-1)
    head step i    position n+i-2: (h_head[n+i-3], d(i-1))          -> di (its own output hidden)

f is where the head's valid KV ends. Hidden rows come from `observe`, which the engine calls
after EVERY target step of a speculating engine (prefill, decode and verify chunks) with the
captured "final" rows (CompileOptions.capture); a chunk starting at position s supersedes every
row at or after s (they were computed from tokens that a later step recomputed, e.g. rejected
drafts), and at proposal time the rows still held are checked against the committed tokens
(a row at a position whose token differs, and every row after it, is dropped). So the head only
ever reads hidden states of committed tokens; its KV at draft positions (steps 2..k) is never
kept: the next round rewrites those positions from the target's rows.

Positions the target never computed in this engine (a prefix reused from the cache) have no
rows: the head's KV then starts at the first computed position, `base`, which becomes the
head's position 0 (rotary attention is relative, so this is exactly the head attending only to
the positions from `base` on; the target's hidden state at each position still carries the
whole context). A recomputation from before `base` (a replay) starts it over from there.

A round of argmax rows (greedy, no penalties: every row of the round) is fed on the device
(`_greedy_round`): each step's pick and output hidden are the next step's inputs without a
host round trip, and the round syncs once, for its drafts; on CUDA the steps replay as one
CUDA Graph chain (ninfer/runtime/executors/cuda/chain.py). Any other round goes step by step
through choose_draft (sampled rows need q for rejection sampling). The target's rows wait in
`HiddenRows` (ninfer/spec/mtp_rows.py): blocks by position on the device, read as slices.

`vocab` (--lm-head-draft, FR-Spec): the head's logits use only those lm_head rows (token ids,
ranked by frequency; ninfer/spec/draft_vocab.py); q is zero outside them, so sampled rows are
still verified exactly and greedy output is unchanged.

`target_media` (a vision plan, --vision): the target executor's media encoder. The head's plan
then reads 3-axis positions and merges vision embeddings (ir/models/mtp.py); `HeadMedia`
(ninfer/spec/mtp_media.py) gives every head chunk the target's 3-axis positions of its rows and
the spans of the placeholders among the tokens it feeds, and supplies their embeddings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from ninfer.runtime.executors.sampler import Sampler
from ninfer.runtime.pages import PagePool
from ninfer.runtime.request import SamplingParams
from ninfer.runtime.step import FED, SeqChunk, StepBatch
from ninfer.spec.draft_head import DraftHead
from ninfer.spec.draft_model import choose_draft
from ninfer.spec.drafter import NO_DRAFT, Draft, DraftRow, TimedDrafter, agree
from ninfer.spec.mtp_media import HeadMedia
from ninfer.spec.mtp_rows import HiddenRows


@dataclass
class _HeadSeq:
    pages: list[int] = field(default_factory=list)
    base: int = 0  # the target position of the head's position 0 (module docstring)
    seen: list[int] = field(default_factory=list)  # target tokens computed at base + i
    rows: HiddenRows = field(default_factory=HiddenRows)  # the target's rows, not fed yet
    fed: list[int] = field(default_factory=list)  # head position i holds (h[base+i], fed[i])
    # how many leading `seen` / `fed` entries agree with the committed tokens, as found by the
    # last _prepare (lowered wherever those lists are cut; drafter.agree)
    seen_ok: int = 0
    fed_ok: int = 0


class MtpDrafter(TimedDrafter):
    """Drafts with `executor`, a plan executor of the artifact's MTP head (module docstring).
    `head` (ninfer/spec/draft_head.py) with `vocab` (its token ids): the reduced draft head of
    --lm-head-draft, whose logits the drafter computes from the head's output hidden (the plan
    then has no logits of its own); None: the plan's full logits."""

    name = "mtp"

    def __init__(
        self,
        executor: Any,
        max_chunk: int = 1 << 30,
        vocab: torch.Tensor | None = None,
        head: DraftHead | None = None,
        vocab_size: int | None = None,
        device_rounds: bool = True,
        target_media: Any = None,
        wide_rows: int = 0,
    ) -> None:
        self.executor = executor
        # most positions a round's first step runs as rows (_first_step): a verify step's rows
        self.wide_rows = wide_rows
        self.media = None  # a vision plan's: the target's positions and embeddings (mtp_media.py)
        if target_media is not None:
            self.media = HeadMedia(target_media, lambda seq_id: self._seqs[seq_id].base)
            executor.use_media(self.media)
        # argmax rows drafted with each step's pick fed back on the device (_greedy_round);
        # False: every round step by step through choose_draft (the tests compare the two)
        self.device_rounds = device_rounds
        self.fed_rounds = 0  # rounds that took the device-fed path
        self.page_size: int = executor.page_size
        self.pool = PagePool(executor.num_pages)
        self.max_chunk = max_chunk  # longest catch-up chunk (the head plan's prefill chunk)
        self.vocab = vocab
        self.head = head
        self.vocab_size = vocab_size or int(executor.plan.model["vocab"])
        self._seqs: dict[int, _HeadSeq] = {}
        self.steps = 0  # head forwards run (bench: drafter cost per round)
        self.seconds = 0.0  # wall time spent proposing

    # -- the engine's hook ---------------------------------------------------------------------
    def observe(self, batch: Any, hidden: dict[str, torch.Tensor]) -> None:
        """The target ran `batch` (a StepBatch); `hidden["final"]` [T, hidden] holds its rows in
        chunk order. Keeps each chunk's rows by position, superseding older ones."""
        rows = hidden["final"]
        r = 0
        for c in batch.chunks:
            n = len(c.token_ids)
            st = self._seqs.setdefault(c.seq_id, _HeadSeq())
            s = c.start_pos
            if not st.base <= s <= st.base + len(st.seen):  # a gap, or recomputed from before
                st.base, st.seen, st.fed, st.seen_ok, st.fed_ok = s, [], [], 0, 0
            del st.seen[s - st.base :]
            st.seen_ok = min(st.seen_ok, s - st.base)
            st.seen.extend(c.token_ids)
            st.rows.put(s, rows[r : r + n].clone())
            r += n
            if self.media is not None:
                self.media.observe(c)

    def forget(self, seq_id: int) -> None:
        st = self._seqs.pop(seq_id, None)
        if st is not None:
            self.pool.release(st.pages)
        if self.media is not None:
            self.media.forget(seq_id)

    # -- proposing -----------------------------------------------------------------------------
    def _propose(self, rows: Sequence[DraftRow], sampler: Sampler) -> list[Draft]:
        depth = self._device_depth(rows)
        live = [i for i, r in enumerate(rows) if r.k > 0 and self._prepare(r, rows, depth)]
        self._catch_up([rows[i] for i in live])
        if depth and live:
            return self._greedy_round(rows, live, depth)
        drafts: list[list[int]] = [[] for _ in rows]
        probs: list[list[torch.Tensor]] = [[] for _ in rows]
        last: dict[int, torch.Tensor] = {}  # row index -> the head's output hidden at its tip
        for step in range(max((rows[i].k for i in live), default=0)):
            active = [i for i in live if rows[i].k > step]
            chunks, hid = [], []
            for i in active:
                r, st = rows[i], self._seqs[rows[i].seq_id]
                if step == 0:
                    chunk, rows_in = self._first_chunk(r)
                else:  # the head's own output at the previous position, and the last draft
                    start = len(r.tokens) - 2 + step - st.base
                    chunk = self._chunk(r.seq_id, (drafts[i][-1],), start)
                    rows_in = last[i][None]
                chunks.append(chunk)
                hid.append(rows_in)
            logits = self._run(StepBatch(tuple(chunks)), torch.cat(hid))
            out = _tip_rows(self.executor.hidden["final"], chunks)
            for row, i in enumerate(active):
                last[i] = out[row]
                tok, q = choose_draft(logits[row : row + 1], rows[i], drafts[i], sampler)
                drafts[i].append(tok)
                if q is not None:
                    probs[i].append(q)
        result = []
        for i, r in enumerate(rows):
            if not drafts[i]:
                result.append(NO_DRAFT)
                continue
            result.append(Draft(tuple(drafts[i]), torch.stack(probs[i]) if probs[i] else None))
        return result

    # -- the device-fed greedy round -----------------------------------------------------------
    def _device_depth(self, rows: Sequence[DraftRow]) -> int:
        """The steps of a device-fed round (`_greedy_round`) for `rows`, 0 when it does not
        apply: a row that samples or has penalties (choose_draft needs the host), or a row
        whose last draft position would pass the head's context with the round's depth."""
        asked = [r for r in rows if r.k > 0]
        if not self.device_rounds or not asked or not all(_argmax_greedy(r.params) for r in asked):
            return 0
        depth = max(r.k for r in asked)
        limit = self.executor.plan.options.max_context
        return depth if all(len(r.tokens) + depth - 2 <= limit for r in asked) else 0

    def _greedy_round(self, rows: Sequence[DraftRow], live: list[int], depth: int) -> list[Draft]:
        """`depth` head steps for argmax rows with each draft and output hidden fed back on
        the device, one host sync at the end: all of them one CUDA Graph (executor.run_chain)
        when the first step's positions fit a verify step's rows (`wide_rows`; the buckets go
        that far), else the first step alone (_first_step) and the others chained, or one
        `run` each. Every row runs `depth` steps (its pages cover them: _prepare); a row keeps
        its first row.k drafts. The drafts are those of the step-by-step path (choose_draft's
        argmax; the reduced head's argmax mapped through `vocab`, which is ascending)."""
        chunks, hid = [], []
        for i in live:
            chunk, rows_in = self._first_chunk(rows[i])
            chunks.append(chunk)
            hid.append(rows_in)
        first, hidden = StepBatch(tuple(chunks)), hid[0] if len(hid) == 1 else torch.cat(hid)
        chain = getattr(self.executor, "run_chain", None)
        self.steps += depth
        self.fed_rounds += 1
        picks = None
        if chain is not None and first.num_tokens <= max(len(chunks), self.wide_rows):
            picks = chain(first, depth, {"hidden": hidden}, self._link)
        if picks is None:
            picks = self._stepped_round(first, hidden, depth, chain)
        table = picks.tolist()  # the round's one sync: [depth][rows]
        result = [NO_DRAFT] * len(rows)
        for row, i in enumerate(live):
            result[i] = Draft(tuple(t[row] for t in table[: rows[i].k]))
        return result

    def _stepped_round(
        self, first: StepBatch, hidden: torch.Tensor, depth: int, chain: Any
    ) -> torch.Tensor:
        """A device-fed round whose first step runs alone: the later steps chained when they
        can be, else one `run` each; the picks [depth, rows]."""
        out = self._first_step(first, hidden)
        pick, nxt = self._link(out, _tip_rows(self.executor.hidden["final"], first.chunks))
        steps = [pick[None]]
        if depth > 1 and chain is not None:
            rest = chain(_fed_step_batch(first.chunks, 1), depth - 1, nxt, self._link, fed=pick)
            if rest is not None:
                return torch.cat([pick[None], rest])
        for j in range(1, depth):
            out = self.executor.run(_fed_step_batch(first.chunks, j), fed=pick, inputs=nxt)
            pick, nxt = self._link(out, self.executor.hidden["final"])
            steps.append(pick[None])
        return torch.cat(steps)

    def _first_step(self, first: StepBatch, hidden: torch.Tensor) -> torch.Tensor:
        """Run a round's first head step alone; its logits at each chunk's tip. A chunk of
        several positions (the round after accepted drafts) asks for every position's logits,
        as a verify chunk does: the CUDA executor then runs its positions as one-token rows
        from a decode graph bucket (executor.run, verify_rows) instead of an eager step, when
        they are no more than a verify step's rows (the buckets go that far; never a prompt's
        backlog, whose logits would be rows of no use)."""
        rows = first.num_tokens
        if rows == len(first.chunks) or rows > self.wide_rows:
            return self.executor.run(first, inputs={"hidden": hidden})
        wide = tuple(replace(c, num_logits=len(c.token_ids)) for c in first.chunks)
        out = self.executor.run(StepBatch(wide), inputs={"hidden": hidden})
        return _tip_rows(out, first.chunks)

    def _first_chunk(self, row: DraftRow) -> tuple[SeqChunk, torch.Tensor]:
        """A round's first head step for `row`: the target's rows the head has not fed yet
        (positions base + len(fed) .. n - 1, each with the token after it) as one chunk, and
        those rows [tokens, hidden]; they count as fed (the last stays held for a repeat)."""
        st = self._seqs[row.seq_id]
        start, n, b = len(st.fed), len(row.tokens) - 1, st.base
        ids = tuple(row.tokens[b + start + 1 : n + 1])
        hidden = st.rows.take(b + start, n)
        st.fed.extend(ids)
        st.rows.drop_below(n - 1)
        return self._chunk(row.seq_id, ids, start), hidden

    def _chunk(
        self, seq_id: int, ids: tuple[int, ...], start: int, logits: bool = True
    ) -> SeqChunk:
        """A head chunk feeding `ids` at head positions start..: on a vision plan with the
        target's 3-axis positions and the spans among the tokens it feeds (mtp_media.py)."""
        st = self._seqs[seq_id]
        extra = {} if self.media is None else self.media.fields(seq_id, st.base, start, len(ids))
        return SeqChunk(seq_id, ids, start, tuple(st.pages), want_logits=logits, **extra)

    def _link(
        self, out: torch.Tensor, final: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """A head step's pick per row (the argmax of its logits `out`, or of the reduced
        head's over the output hidden `final` [rows, hidden]) and the next step's inputs."""
        if self.head is None:
            pick = out.argmax(-1)
        else:
            pick = self.vocab[self._draft_logits(final).argmax(-1)]
        return pick, {"hidden": final}

    def _run(self, batch: StepBatch, hidden: torch.Tensor) -> torch.Tensor:
        """One head forward; logits [rows, vocab] (full vocabulary; -inf outside the reduced
        head's `vocab`)."""
        self.steps += 1
        logits = self.executor.run(batch, inputs={"hidden": hidden})
        if self.head is None:
            return logits
        h = _tip_rows(self.executor.hidden["final"], batch.chunks)  # every chunk wants logits
        full = torch.full((h.shape[0], self.vocab_size), float("-inf"), device=h.device)
        full[:, self.vocab] = self._draft_logits(h).float()
        return full

    def _draft_logits(self, h: torch.Tensor) -> torch.Tensor:
        """The reduced head's logits [rows, len(vocab)] of output rows `h`, in the model dtype
        (ninfer/spec/draft_head.py: fp8 rows on CUDA). Both rounds (step by step and
        device-fed) call this."""
        return self.head.logits(h)

    def _catch_up(self, rows: Sequence[DraftRow]) -> None:
        """Feed long backlogs (a new prompt, a replay) in chunks of at most `max_chunk` tokens
        until each row has at most `max_chunk` positions left for step 1."""
        while True:
            chunks, hid = [], []
            for r in rows:
                st = self._seqs[r.seq_id]
                start, n, b = len(st.fed), len(r.tokens) - 1 - st.base, st.base
                if n - start > self.max_chunk:
                    end = start + self.max_chunk
                    ids = tuple(r.tokens[b + start + 1 : b + end + 1])
                    hid.append(st.rows.take(b + start, b + end))
                    st.rows.drop_below(b + end)
                    chunks.append(self._chunk(r.seq_id, ids, start, logits=False))
                    st.fed.extend(ids)
            if not chunks:
                return
            self.steps += 1
            self.executor.run(StepBatch(tuple(chunks)), inputs={"hidden": torch.cat(hid)})

    def _evict(self, st: _HeadSeq) -> None:
        """Give back a sequence's head KV; it restarts at its oldest target row still held."""
        self.pool.release(st.pages)
        first = st.rows.first()
        base = st.base + len(st.seen) if first is None else first
        st.pages, st.fed, st.seen, st.base = [], [], st.seen[base - st.base :], base
        st.seen_ok = st.fed_ok = 0

    def _prepare(self, row: DraftRow, rows: Sequence[DraftRow], depth: int = 0) -> bool:
        """Drop what the committed tokens no longer support, check the target's rows cover
        the positions the head still needs, and hold pages through the last draft position
        (of `depth` drafts, when given, else of row.k); False when they do not, or the pool
        cannot give the pages (after taking back those of requests not in this round)."""
        st = self._seqs.get(row.seq_id)
        if st is None:
            return False
        tokens, b = row.tokens, st.base
        n = len(tokens) - 1 - b  # the target computed head positions 0 .. n-1 (b .. b+n-1)
        # the rows of committed tokens, and the head positions still good
        valid = agree(st.seen, tokens, b, min(len(st.seen), n), st.seen_ok)
        del st.seen[valid:]
        st.rows.drop_from(b + valid)
        fed = agree(st.fed, tokens, b + 1, min(len(st.fed), valid), st.fed_ok)
        if fed == n and b + n - 1 in st.rows:  # proposing again with nothing new: redo the tip
            fed = n - 1
        del st.fed[fed:]
        st.seen_ok, st.fed_ok = valid, fed
        if n < 1 or valid < n or fed == n or not st.rows.has(b + fed, b + n):
            return False  # no target rows for what the head needs (not computed here)
        st.rows.drop_below(b + fed)
        end = n + (depth or row.k) - 1  # positions computed: 0 .. n-1, then k - 1 drafts
        need = -(-end // self.page_size) - len(st.pages)
        if need > self.pool.num_free:
            keep = {r.seq_id for r in rows}
            for other in [s for s in self._seqs if s not in keep and self._seqs[s].pages]:
                self._evict(self._seqs[other])
                if need <= self.pool.num_free:
                    break
        if need > 0:
            pages = self.pool.allocate(need)
            if pages is None:
                return False
            st.pages += pages
        return True


def _argmax_greedy(params: SamplingParams) -> bool:
    """Whether a row's draft is the argmax of the head's raw logits (choose_draft: greedy,
    and no penalty that depends on the drafts before it)."""
    return params.greedy and not (params.presence_penalty or params.frequency_penalty)


def _fed_step_batch(chunks: Sequence[SeqChunk], j: int) -> StepBatch:
    """Step j + 1 of a device-fed round after its first step `chunks`: one row per chunk at
    the position j after its last, each token the previous step's pick (FED)."""
    return StepBatch(tuple(_fed_step(c, j) for c in chunks), fed_rows=tuple(range(len(chunks))))


def _fed_step(first: SeqChunk, j: int) -> SeqChunk:
    """Step j + 1 of a device-fed round whose first step ran `first`: one fed token, j
    positions after first's last (its layout kept; no media: a draft is no placeholder)."""
    start = first.start_pos + len(first.token_ids) - 1 + j
    return replace(first, token_ids=(FED,), start_pos=start, media=())


def _tip_rows(final: torch.Tensor, chunks: Sequence[SeqChunk]) -> torch.Tensor:
    """The rows of `final` (a step's rows of every position, in chunk order: captured hidden
    rows, or logits of every position) at each chunk's last position: `final` itself when
    every chunk is one token."""
    if final.shape[0] == len(chunks):
        return final
    ends = torch.tensor([len(c.token_ids) for c in chunks]).cumsum(0).sub_(1)
    return final.index_select(0, ends.to(final.device, non_blocking=True))
