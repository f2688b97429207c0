"""Train a tiny DFlash drafter for the trained tiny-agent fixture by self-distillation.

    python -m artifacts.train_dflash [--out artifacts/fixtures] [--measure]
                                     [--target artifacts/fixtures/tiny-agent.ninfer]

1. The target (tiny-agent.ninfer, loaded into transformers' Qwen3ForCausalLM from the
   artifact's own weights) greedily continues the scripted prompts of the agent corpus
   (tiny-agent.prompts.json) until <|im_end|>: the drafter learns the target's own outputs.
   Only turns of at most MAX_TOKENS tokens (those without the long tool-schema system prompt,
   among them the first eight the tests speculate on) are used, to keep training near a
   minute on 2 cores.
2. One target forward per sequence gives the residual stream after layers TARGET_LAYERS
   (forward hooks: the same values as the plan's "L{l}" capture).
3. The drafter (1 Qwen3 layer, block 8, the target's embedding and LM head frozen) is trained
   with AdamW, full batch, on the blocks the serving loop meets: an anchor at each position s
   of a continuation, block [token s, mask x 7] at positions s .. s + 7, context = the target
   states of positions < s, labels tokens s + 1 .. s + 7 (cross-entropy, later positions
   weighted down). All blocks of a sequence share one row of the batch, each block's queries
   masked to its own context and block.
4. It stops when the teacher-forced acceptance length (1 + the leading drafts that match,
   averaged over anchors: what a round from that anchor would accept) reaches --tau, and
   writes the drafter in the published layout, bf16 (OUT/<target>-dflash/: config.json,
   model.safetensors, and trained_for.json naming the target weights it was trained for).

The result for the committed fixture is committed (artifacts/fixtures/tiny-agent-dflash/,
0.5 MB): training takes 2-3 CPU minutes, several times that on a loaded machine. Tests attach
it to the target (`attached`, as `ninfer convert --dflash` does); when the fixture's weights
have changed since (trained_for.json), they train a fresh drafter on first use instead, so
rerun this script after retraining the fixture. Everything is seeded.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from artifacts.fixture_dflash import dflash_config, random_state, save_hf
from artifacts.fixtures import HERE, TINY_AGENT, TINY_AGENT_PROMPTS

COMMITTED = TINY_AGENT.parent / "tiny-agent-dflash"  # the drafter trained for the fixture
SEED = 4321
TARGET_LAYERS = [1, 2, 3]
BLOCK = 8
DECAY = 4.0
MAX_TOKENS = 160  # turns longer than this (prompt + reply tokens) are left out  # weight of draft j: exp(-(j - 1) / DECAY)


def _target(path: Path) -> tuple[Any, Any]:
    """(transformers model of the artifact, the artifact)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from ninfer.artifact.format import Artifact

    a = Artifact(path)
    cfg = {k: v for k, v in a.config.items() if k not in ("architectures", "transformers_version")}
    model = Qwen3ForCausalLM(Qwen3Config(**cfg))
    state = {n: torch.from_numpy(a.dense(n).copy()) for n in a}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if [m for m in missing if m != "lm_head.weight"] or unexpected:
        raise SystemExit(f"{path}: weights do not fit Qwen3 ({missing}, {unexpected})")
    model.tie_weights()
    return model.float().eval(), a


def continuations(model: Any, prompts: list[list[int]], guess: list[list[int]], eos: int,
                  max_new: int = 160) -> list[list[int]]:  # fmt: skip
    """The target's greedy continuation of every prompt, through its EOS. `guess` (the
    scripted replies) is checked in one teacher-forced forward: it is the greedy continuation
    exactly where every argmax reproduces it; from the first mismatch on, `generate` decides."""
    import torch

    out = []
    with torch.no_grad():
        for p, g in zip(prompts, guess):
            best = model(torch.tensor([p + g])).logits[0, len(p) - 1 :].argmax(-1).tolist()
            n = 0
            while n < len(g) and best[n] == g[n] and g[n] != eos:
                n += 1
            if n < len(g) and best[n] == g[n] == eos:
                out.append(g[: n + 1])
                continue
            head = p + g[:n]
            more = model.generate(
                torch.tensor([head]), attention_mask=torch.ones(1, len(head), dtype=torch.long),
                max_new_tokens=max_new - n, do_sample=False, eos_token_id=eos, pad_token_id=eos,
            )[0, len(head):].tolist()  # fmt: skip
            out.append(g[:n] + more)
    return out


def residuals(model: Any, ids: Any) -> list[Any]:
    """The residual stream after every layer [T, hidden] (the plan's "L{i}" capture; unlike
    transformers' last hidden state, the last layer's too is before the final norm)."""
    import torch

    out: list[Any] = []
    hooks = [
        layer.register_forward_hook(
            lambda _m, _i, o: out.append(o[0] if isinstance(o, tuple) else o)
        )
        for layer in model.model.layers
    ]
    try:
        with torch.no_grad():
            model(ids[None])
    finally:
        for h in hooks:
            h.remove()
    return [x[0] for x in out]


def _examples(model: Any, prompts: list[list[int]], conts: list[list[int]]) -> list[dict]:
    """Per sequence: ids, the chosen target states [T, 3 * hidden] and the anchors."""
    import torch

    out = []
    with torch.no_grad():
        for p, c in zip(prompts, conts):
            ids = torch.tensor(p + c)
            feats = torch.cat([residuals(model, ids)[i] for i in TARGET_LAYERS], dim=-1)
            out.append({"ids": ids, "feats": feats, "anchors": list(range(len(p), len(ids) - 1))})
    return out


def _batch(examples: list[dict], per_seq: int, mask_id: int, gen: Any) -> dict:
    """Up to `per_seq` random anchors of every sequence, all blocks of a sequence packed in one
    row of a padded batch: tokens / positions [S, A*B], labels [S, A, B-1] (-100: none),
    context rows [S, T] and keep [S, 1, A*B, T + A*B] (each block sees the context before its
    anchor and its own B positions)."""
    import torch

    S, T = len(examples), max(len(ex["ids"]) for ex in examples)
    A = min(per_seq, max(len(ex["anchors"]) for ex in examples))
    tokens = torch.full((S, A, BLOCK), mask_id)
    pos = torch.zeros((S, A, BLOCK), dtype=torch.long)
    labels = torch.full((S, A, BLOCK - 1), -100)
    keep = torch.zeros((S, A * BLOCK, T + A * BLOCK), dtype=torch.bool)
    feats = torch.zeros((S, T, examples[0]["feats"].shape[-1]))
    own = torch.eye(A, dtype=torch.bool).repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)
    for i, ex in enumerate(examples):
        ids, n = ex["ids"], len(ex["ids"])
        feats[i, :n] = ex["feats"]
        pick = torch.randperm(len(ex["anchors"]), generator=gen)[:A]
        s = torch.tensor(ex["anchors"])[pick]
        a = len(s)
        pos[i, :a] = s[:, None] + torch.arange(BLOCK)[None]
        tokens[i, :a, 0] = ids[s]
        padded = torch.cat([ids, torch.full((BLOCK,), -100)])
        labels[i, :a] = padded[pos[i, :a, 1:]]
        ctx = (torch.arange(T)[None, :] < s[:, None]).repeat_interleave(BLOCK, 0)
        keep[i, : a * BLOCK, :T] = ctx
        keep[i, :, T:] = own
    return {"tokens": tokens.flatten(1), "pos": pos.flatten(1), "labels": labels,
            "keep": keep[:, None], "feats": feats, "ctx_pos": torch.arange(T)}  # fmt: skip


def train(
    target: Path, max_minutes: float, tau: float, log=print, lr: float = 1e-2, per_seq: int = 64
) -> tuple[dict, dict, Any]:
    """(drafter config.json, trained state, the target artifact)."""
    import torch
    import torch.nn.functional as F

    from ninfer.artifact.dflash import DFlashConfig
    from ninfer.spec.dflash_model import DFlashModel

    torch.manual_seed(SEED)
    model, art = _target(target)
    prompts_json = json.loads(TINY_AGENT_PROMPTS.read_text(encoding="utf-8"))["prompts"]
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(art.tokenizer_json)

    # the turns without the long tool-schema system prompt (the first eight are the ones the
    # tests speculate on): a few hundred tokens, so training stays near a minute on 2 cores
    def ids(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False).ids

    turns = [(ids(p["prompt"]), ids(p["reply"])) for p in prompts_json]
    turns = [(p, r) for p, r in turns if len(p) + len(r) <= MAX_TOKENS]
    prompts = [p for p, _ in turns]
    eos = int(art.config["eos_token_id"])
    t0 = time.monotonic()
    replies = [r for _, r in turns]
    conts = continuations(model, prompts, replies, eos)
    log(
        f"{len(conts)} greedy continuations ({sum(map(len, conts))} tokens) in {time.monotonic() - t0:.0f}s"
    )
    cfg_json = dflash_config(art.config, layers=1, block_size=BLOCK, target_layer_ids=TARGET_LAYERS)
    cfg = DFlashConfig.from_config(
        cfg_json, len(art.config["layer_types"]), art.config["hidden_size"]
    )
    params = {
        k: v.clone().requires_grad_(True) for k, v in random_state(cfg_json, SEED, std=0.02).items()
    }
    embed = model.model.embed_tokens.weight.detach()
    head = model.lm_head.weight.detach()
    drafter = DFlashModel(cfg, params, embed, head)
    mask_id = cfg.mask_token_id
    examples = _examples(model, prompts, conts)
    weight = torch.exp(-torch.arange(BLOCK - 1) / DECAY)
    opt = torch.optim.AdamW(params.values(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0)
    gen = torch.Generator().manual_seed(SEED)
    step = 0
    while True:
        b = _batch(examples, per_seq, mask_id, gen)
        opt.zero_grad(set_to_none=True)
        kv = drafter.context_kv(b["feats"], b["ctx_pos"][None])  # [S, T, width] per layer
        h = drafter.forward(b["tokens"], b["pos"], kv, b["keep"])  # [S, A*B, hidden]
        h = h.unflatten(1, (-1, BLOCK))[:, :, 1:]  # [S, A, B-1, hidden]
        logits = F.linear(h, head)
        labels = b["labels"]
        ce = F.cross_entropy(
            logits.flatten(0, 2), labels.flatten(), ignore_index=-100, reduction="none"
        )
        w = (labels != -100) * weight
        loss = (ce.view_as(labels) * w).sum() / w.sum()
        loss.backward()
        opt.step()
        step += 1
        with torch.no_grad():  # the drafts a round from each anchor would accept
            hit = ((logits.argmax(-1) == labels) & (labels != -100)).int()
            real = labels[..., 0] != -100
            est = 1 + float(hit.cumprod(dim=-1).sum(-1)[real].float().mean())
        elapsed = time.monotonic() - t0
        if step % 10 == 0 or est >= tau:
            log(f"step {step:4d}  loss {float(loss.detach()):.3f}  tau {est:.2f}  {elapsed:.0f}s")
        if est >= tau and step >= 20:
            return cfg_json, {k: v.detach() for k, v in params.items()}, art
        if elapsed > max_minutes * 60:
            raise SystemExit(f"dflash drafter: tau {est:.2f} < {tau} after {max_minutes} minutes")


def fingerprint(target: Path) -> str:
    """What identifies the target's weights: a hash of its tensors' stored checksums."""
    import xxhash

    from ninfer.artifact.format import Artifact

    tensors = Artifact(target).header["tensors"]
    parts = sorted((n, p, v["xxh3"]) for n, t in tensors.items() for p, v in t["parts"].items())
    return xxhash.xxh3_64_hexdigest(json.dumps(parts).encode())


def build(out_dir: Path, target: Path = TINY_AGENT, max_minutes: float = 8.0, tau: float = 3.0,
          log=print) -> Path:  # fmt: skip
    """Train; write the drafter directory out_dir/<target>-dflash/ (config.json,
    model.safetensors in bf16, trained_for.json: the target's name and `fingerprint`)."""
    cfg, state, _ = train(target, max_minutes, tau, log)
    hf = save_hf(out_dir / f"{target.stem}-dflash", cfg, state, dtype="bfloat16")
    (hf / "trained_for.json").write_text(
        json.dumps({"target": target.name, "fingerprint": fingerprint(target)}, indent=1) + "\n",
        encoding="utf-8",
    )
    return hf


def attached(target: Path, out_dir: Path, drafter: Path = COMMITTED, log=print) -> Path:
    """out_dir/<target>-dflash-trained.ninfer: `target` with the drafter of `drafter` attached
    when it was trained for these weights (trained_for.json), else with one trained now (into
    out_dir: minutes; the fixture was retrained, rerun this script to refresh the commit)."""
    from ninfer.artifact.dflash import attach_dflash

    stamp = drafter / "trained_for.json"
    ok = stamp.exists() and json.loads(stamp.read_text())["fingerprint"] == fingerprint(target)
    if not ok:
        log(f"{drafter} was not trained for {target}: training a drafter now")
        drafter = build(out_dir, target, max_minutes=20.0, log=log)
    return attach_dflash(target, drafter, out_dir / f"{target.stem}-dflash-trained.ninfer")


def measure(path: Path, k: int = 7, prompts: int = 8, log=print) -> dict[str, Any]:
    """Serve `path` (a target with its drafter) with and without --spec dflash on the first
    `prompts` scripted prompts (greedy, until <|im_end|>): tau, acceptance by position, the
    drafter's time per round, tok/s of both runs and whether the outputs are identical."""
    from tokenizers import Tokenizer

    from ninfer.artifact.format import Artifact
    from ninfer.runtime.build import build_engine
    from ninfer.runtime.config import EngineOptions
    from ninfer.runtime.request import Request, SamplingParams

    tok = Tokenizer.from_str(Artifact(path).tokenizer_json)
    turns = json.loads(TINY_AGENT_PROMPTS.read_text(encoding="utf-8"))["prompts"][:prompts]
    params = SamplingParams(max_tokens=160, temperature=0.0)
    reqs = [Request(tuple(tok.encode(t["prompt"], add_special_tokens=False).ids), params) for t in turns]  # fmt: skip
    common = {"max_concurrency": prompts, "max_context": 512, "kv_capacity": 4096}
    out: dict[str, Any] = {}
    for name, extra in (("plain", {}), ("dflash", {"spec": "dflash", "draft_tokens": k})):
        with build_engine(Artifact(path), EngineOptions.of(**common, **extra)) as engine:
            t0 = time.perf_counter()
            res = [h.result(600) for h in [engine.submit(r) for r in reqs]]
            wall = time.perf_counter() - t0
            n = sum(len(o.token_ids) for o in res)
            out[name] = {"tokens": [o.token_ids for o in res], "tok_per_s": n / wall}
            if engine.speculator is not None:
                specs = [o.timings.speculative for o in res]
                rounds = sum(s["rounds"] for s in specs)
                accepted = sum(s["accepted_tokens"] for s in specs)
                drafter = engine.speculator.drafter
                out["tau"] = 1 + accepted / rounds
                out["accepted_by_position"] = [
                    round(sum(s["accepted_per_position"][j] for s in specs) / rounds, 3)
                    for j in range(k)
                ]
                out["drafter_ms_per_round"] = 1e3 * drafter.seconds / max(drafter.steps, 1)
    out["identical"] = out["plain"].pop("tokens") == out["dflash"].pop("tokens")
    out["speedup"] = out["dflash"]["tok_per_s"] / out["plain"]["tok_per_s"]
    log(json.dumps(out, indent=1))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m artifacts.train_dflash", description=__doc__.splitlines()[0]
    )
    p.add_argument("--target", type=Path, default=TINY_AGENT)
    p.add_argument("--out", type=Path, default=HERE / "fixtures",
                   help="directory to write the drafter directory <target>-dflash/ into")  # fmt: skip
    p.add_argument("--max-minutes", type=float, default=3.0)
    p.add_argument(
        "--tau", type=float, default=4.0, help="teacher-forced acceptance length to reach"
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--measure",
        action="store_true",
        help="then serve the result with and without --spec dflash (k = 7, the first eight "
        "prompts) and print tau, acceptance by position, the drafter's time per round, tok/s",
    )
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    hf = build(args.out, args.target, args.max_minutes, args.tau)
    print(hf)
    if args.measure:
        with tempfile.TemporaryDirectory() as tmp:
            measure(attached(args.target, Path(tmp), hf))
    return 0


if __name__ == "__main__":
    sys.exit(main())
