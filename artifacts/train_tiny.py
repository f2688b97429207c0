"""Train the tiny agent model that thinks and calls tools; write the committed fixture.

    python -m artifacts.train_tiny [--out artifacts/fixtures] [--max-minutes 8]

A Qwen3-architecture model of about 1M parameters, with the tiny tokenizer of
`artifacts.tokenizer` and our chat template (ninfer/api/service/templates/qwen_xml.jinja), is trained on
CPU (2 threads, AdamW, full batch) on the scripted turns of `artifacts.agent_corpus`, rendered
with that template. Loss falls only on the assistant reply tokens. Training stops when, for every
turn, teacher-forced argmax reproduces the reply with a logit margin of at least `--margin` and
the same holds by half that margin with the weights in bf16, and greedy decoding of every prompt
reproduces its reply exactly (ending with <|im_end|>). About 100 steps, a few minutes on 2 idle
cores; `--max-minutes` bounds it.

The fixture records Qwen3's generation defaults (generation_config.json: temperature 0.6, top_p
0.95, top_k 20, artifacts/fixtures.py), so a client that sends no sampling field gets what a real
Qwen3 deployment gives it. The default margin makes those defaults replay every scripted turn
exactly, not only greedy decoding: with every rival at least `m` logits below the reply token,
the reply token holds at least 1 / (1 + (k - 1) e^(-m / T)) of the top-k mass, which reaches
top_p once m >= T ln((k - 1) top_p / (1 - top_p)) (3.53 here, `replay_margin`); top-p then keeps
the reply token alone. An agent framework run with its defaults (temperature unset) therefore
follows its scripted turns.

Outputs (in --out):
    tiny-agent.ninfer        converted with `convert_hf` (float32 weights, template embedded)
    tiny-agent.prompts.json  for every turn: messages, tools, enable_thinking, the rendered prompt
                             text, the expected reply text, and its parsed reasoning, content and
                             tool calls
Everything is seeded; a rerun on the same software gives the same model.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from artifacts.agent_corpus import Example, examples
from artifacts.fixtures import HERE, chat_template, generation_config, save_text_files
from artifacts.tokenizer import (
    EOS_TOKEN,
    PAD_TOKEN,
    VOCAB_SIZE,
    build_tokenizer,
    token_id,
)

SEED = 1234
NAME = "tiny-agent"
MODEL = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}


@dataclass(frozen=True)
class Turn:
    """One scripted turn, rendered and tokenised."""

    example: Example
    prompt: str  # rendered conversation + generation prompt
    reply: str  # what the model must generate, ending with <|im_end|>
    prompt_ids: list[int]
    reply_ids: list[int]


def render(ex: Example, hf_tokenizer: Any) -> tuple[str, str]:
    """(prompt text, reply text) of one turn under the chat template (transformers' renderer)."""
    kw = {"tools": ex.tools or None, "tokenize": False, "enable_thinking": ex.enable_thinking}
    prompt = hf_tokenizer.apply_chat_template(ex.messages, add_generation_prompt=True, **kw)
    full = hf_tokenizer.apply_chat_template(
        ex.messages + [ex.reply], add_generation_prompt=False, **kw
    )
    if not full.startswith(prompt):
        raise AssertionError(f"{ex.name}: the rendered reply does not extend the generation prompt")
    rest = full[len(prompt) :]
    return prompt, rest[: rest.index(EOS_TOKEN) + len(EOS_TOKEN)]


def build_turns() -> tuple[list[Turn], Any]:
    from transformers import PreTrainedTokenizerFast

    tok = build_tokenizer()
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN)
    hf_tok.chat_template = chat_template()
    turns = []
    for ex in examples():
        prompt, reply = render(ex, hf_tok)
        p_ids, r_ids = tok.encode(prompt).ids, tok.encode(reply).ids
        # the server encodes a later prompt (this turn as history) in one piece: same ids
        if tok.encode(prompt + reply).ids != p_ids + r_ids:
            raise AssertionError(f"{ex.name}: prompt and reply do not tokenise independently")
        turns.append(Turn(ex, prompt, reply, p_ids, r_ids))
    return turns, tok


def _sequences(turns: list[Turn]) -> list[tuple[list[int], list[tuple[int, int]]]]:
    """Training sequences: (token ids, reply spans [start, end)). A turn whose prompt + reply
    begins a later turn's prompt (the agent loop: call, tool result, answer) rides along inside
    that turn's sequence instead of being computed twice."""
    seqs = []
    for i, t in enumerate(turns):
        seq = t.prompt_ids + t.reply_ids
        if any(j != i and u.prompt.startswith(t.prompt + t.reply) for j, u in enumerate(turns)):
            continue  # trained inside the longer sequence
        spans = [(len(t.prompt_ids), len(seq))]
        for u in turns:
            head = u.prompt_ids + u.reply_ids
            if u is not t and t.prompt.startswith(u.prompt + u.reply) and seq[: len(head)] == head:
                spans.append((len(u.prompt_ids), len(head)))
        seqs.append((seq, sorted(spans)))
    covered = sum(len(spans) for _, spans in seqs)
    if covered != len(turns):
        raise AssertionError(f"{covered} reply spans for {len(turns)} turns")
    return seqs


def _batches(turns: list[Turn], pad: int, n_batches: int = 3):
    """Right-padded batches of sequences of similar length: (ids [B, T], target mask [B, T-1])."""
    import torch

    seqs = sorted(_sequences(turns), key=lambda s: len(s[0]))
    size = math.ceil(len(seqs) / n_batches)
    out = []
    for start in range(0, len(seqs), size):
        group = seqs[start : start + size]
        T = max(len(seq) for seq, _ in group)
        ids = torch.full((len(group), T), pad, dtype=torch.long)
        mask = torch.zeros((len(group), T - 1), dtype=torch.bool)  # position j predicts token j+1
        for b, (seq, spans) in enumerate(group):
            ids[b, : len(seq)] = torch.tensor(seq)
            for lo, hi in spans:
                mask[b, lo - 1 : hi - 1] = True
        out.append((ids, mask))
    return out


def greedy(model: Any, prompt_ids: list[int], max_new: int, eos: int) -> list[int]:
    """Greedy decoding (transformers' `generate`, KV cache), ending after `eos` if it comes."""
    import torch

    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
            max_new_tokens=max_new, do_sample=False, eos_token_id=eos, pad_token_id=eos,
        )  # fmt: skip
    return out[0, len(prompt_ids) :].tolist()


def reply_margins(model: Any, batches: list[tuple[Any, Any]]) -> tuple[Any, Any]:
    """Teacher-forced check of every reply token: (loss summed over targets, gap [N]) where gap
    is the target's logit minus the best other logit (> 0: argmax is the target). When every gap
    is positive, greedy decoding reproduces every reply exactly (induction over positions)."""
    import torch
    import torch.nn.functional as F

    loss_sum, gaps = 0.0, []
    for ids, mask in batches:
        logits = model(ids).logits[:, :-1]  # [B, T-1, V]
        lg, tg = logits[mask].float(), ids[:, 1:][mask]  # [N, V], [N]
        loss_sum = loss_sum + F.cross_entropy(lg, tg, reduction="sum")
        with torch.no_grad():
            gold = lg.gather(1, tg[:, None])[:, 0]
            other = lg.scatter(1, tg[:, None], -math.inf).amax(1)
            gaps.append(gold - other)
    return loss_sum, torch.cat(gaps)


def train(
    turns: list[Turn],
    tok: Any,
    *,
    margin: float,
    max_minutes: float,
    lr: float = 1e-2,
    model_overrides: dict[str, Any] | None = None,
    log=print,
) -> Any:
    """Train until every reply token wins by `margin` logits (by margin / 2 with bf16 weights)
    and greedy decoding replays every turn; returns the model in eval mode."""
    import copy

    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(SEED)
    eos, pad = token_id(tok, EOS_TOKEN), token_id(tok, PAD_TOKEN)
    cfg = {**MODEL, **(model_overrides or {})}
    model = Qwen3ForCausalLM(
        Qwen3Config(**cfg, eos_token_id=eos, pad_token_id=pad, bos_token_id=None)
    )
    batches = _batches(turns, pad)
    n_targets = sum(int(m.sum()) for _, m in batches)
    n_tokens = sum(ids.numel() for ids, _ in batches)
    log(
        f"{NAME}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, {len(turns)} turns, {n_tokens} tokens a step"
    )
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0)
    warmup = 10
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))
    start = time.monotonic()
    step = 0
    while True:
        model.train()
        opt.zero_grad(set_to_none=True)
        loss_sum, gap = reply_margins(model, batches)
        (loss_sum / n_targets).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        step += 1
        elapsed = time.monotonic() - start
        worst = float(gap.min())  # before this step's update
        if step % 10 == 0 or worst >= margin:
            log(
                f"step {step:4d}  loss {float(loss_sum.detach()) / n_targets:.4f}  argmax {int((gap > 0).sum())}/{n_targets}  margin {worst:+.2f}  {elapsed:.0f}s"
            )
        if worst >= margin:
            model.eval()
            with torch.no_grad():
                worst = float(reply_margins(model, batches)[1].min())
                worst_bf16 = float(
                    reply_margins(copy.deepcopy(model).to(torch.bfloat16), batches)[1].min()
                )
            if worst >= margin and worst_bf16 >= margin / 2 and _replays(model, turns, eos):
                log(f"all {len(turns)} turns replay exactly after {step} steps, {elapsed:.0f}s "
                    f"(margin {worst:.2f}, {worst_bf16:.2f} in bf16)")  # fmt: skip
                return model
        if elapsed > max_minutes * 60:
            raise SystemExit(
                f"{NAME}: not converged after {max_minutes} minutes; grow the model or shrink the corpus"
            )


def replay_margin(generation: dict[str, Any]) -> float:
    """The smallest logit margin of the reply token over every rival for which sampling with
    the recorded `generation` defaults (temperature, top_k, top_p) can only pick it (see the
    module docstring); 0 for greedy defaults."""
    t, k, p = (
        generation.get("temperature", 1.0),
        generation.get("top_k", 0),
        generation.get("top_p", 1.0),
    )
    if not generation.get("do_sample", True) or t == 0:
        return 0.0
    if p >= 1.0:
        return math.inf  # no top-p: every rival keeps some probability
    rivals = (k - 1) if k > 0 else VOCAB_SIZE - 1
    return t * math.log(rivals * p / (1 - p))


def _replays(model: Any, turns: list[Turn], eos: int) -> bool:
    return all(greedy(model, t.prompt_ids, len(t.reply_ids) + 8, eos) == t.reply_ids for t in turns)


def expected(t: Turn) -> dict[str, Any]:
    """The reply split the way a Qwen reasoning + XML tool parser should split it."""
    r = t.example.reply
    return {
        "reasoning": r.get("reasoning_content", "") if t.example.enable_thinking else None,
        "content": r.get("content") or "",
        "tool_calls": [
            {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
            for c in r.get("tool_calls", [])
        ],
    }


def write_outputs(model: Any, turns: list[Turn], out_dir: Path) -> Path:
    from ninfer.artifact.convert_hf import convert_hf

    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        hf = Path(tmp) / f"{NAME}-hf"
        model.save_pretrained(hf)
        save_text_files(hf)
        path = convert_hf(hf, out_dir / f"{NAME}.ninfer", name=NAME)
        shutil.rmtree(hf)
    prompts = {
        "about": "Scripted turns of artifacts/agent_corpus.py; greedy decoding of `prompt` with "
        "tiny-agent.ninfer yields `reply` (which ends with <|im_end|>). Regenerate with "
        "`python -m artifacts.train_tiny`.",
        "prompts": [
            {
                "name": t.example.name,
                "messages": t.example.messages,
                "tools": t.example.tools,
                "enable_thinking": t.example.enable_thinking,
                "prompt": t.prompt,
                "reply": t.reply,
                "expected": expected(t),
            }
            for t in turns
        ],
    }
    (out_dir / f"{NAME}.prompts.json").write_text(
        json.dumps(prompts, indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m artifacts.train_tiny", description=__doc__.splitlines()[0]
    )
    p.add_argument("--out", type=Path, default=HERE / "fixtures")
    p.add_argument("--max-minutes", type=float, default=8.0)
    p.add_argument(
        "--margin",
        type=float,
        default=3.75,
        help="smallest logit gap of a reply token over the runner-up (at least `replay_margin`"
        " of the recorded generation defaults)",
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument(
        "--model",
        type=json.loads,
        default={},
        help="config overrides, e.g. '{\"hidden_size\": 96}'",
    )
    args = p.parse_args(argv)
    needed = replay_margin(generation_config(0, 0))
    if args.margin < needed:
        p.error(f"--margin {args.margin} is below {needed:.2f}: the recorded sampling defaults"
                " would not replay every turn")  # fmt: skip
    import torch

    torch.set_num_threads(args.threads)
    turns, tok = build_turns()
    model = train(
        turns,
        tok,
        margin=args.margin,
        max_minutes=args.max_minutes,
        lr=args.lr,
        model_overrides=args.model,
    )
    print(write_outputs(model, turns, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
