"""Self-distil an MTP head for the trained tiny-agent fixture; write it as its mtp component.

    python -m artifacts.train_mtp [--head artifacts/fixtures/tiny-agent.mtp.safetensors]
                                  [--target artifacts/fixtures/tiny-agent.ninfer] [--out OUT.ninfer]

Data: the target's own greedy continuations of every scripted prompt of
tiny-agent.prompts.json (ninfer's engine decodes them), and the target's hidden states after
its final norm at every position of prompt + continuation (ninfer's executor, capture "final").
The head (ir/models/mtp.py layout; the target is Qwen3, so its layer is a Qwen3 layer, started
as a copy of the target's last layer: artifacts/mtp_head.py) is trained in float32 on CPU with
Adam, full batch, on what verification accepts: at position p, from (h[p], token p + 1), the
target's greedy token at p + 2. Drafting k > 1 re-runs the head on its own output, so training
unrolls 3 steps as drafting does: step i at position q reads the head's step i - 1 output at
q - 1 and attends to step 0's keys up to q - i and to its own steps' keys after them (the KV
a drafting head holds). Loss: cross-entropy of every step against the target's greedy token.

It also writes `mtp.draft_vocab` (float32 token ids, most frequent first): token counts of
the target's greedy continuations, the ranking `--lm-head-draft` uses (ninfer/spec/draft_vocab.py).
Training stops when every unrolled step reproduces the target's greedy tokens (accuracy 0.99)
or after --steps. Everything is seeded, one thread; about 2-3 minutes on the shared 2-core
machine, so the head is committed (artifacts/fixtures/tiny-agent.mtp.safetensors, with the
xxh3 of the tiny-agent it was trained for): `tiny_agent_mtp(root)` attaches it to the fixture
(`ninfer convert tiny-agent.ninfer --mtp-head ...` does the same), and trains a fresh one
when tiny-agent.ninfer has changed since.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from artifacts.fixtures import HERE, TINY_AGENT, TINY_AGENT_PROMPTS
from artifacts.mtp_head import initial_head

SEED = 4321
STEPS = 200
HEAD = HERE / "fixtures" / "tiny-agent.mtp.safetensors"
UNROLL = 3  # drafting steps trained (k = 3 re-runs the head twice on its own output)
LR = 1e-2
WINDOW = 64  # prompt positions kept before the first draft (the head's KV context in training)


def distillation_data(target: Path, prompts: Path) -> list[dict[str, torch.Tensor]]:
    """Per prompt: tokens S (prompt + greedy continuation), the target's final hidden rows
    H [len(S), hidden] and its greedy token y[p] after S[: p + 1]."""
    from tokenizers import Tokenizer

    from ninfer import LLM, SamplingParams
    from ninfer.artifact.format import Artifact
    from ninfer.passes.options import CompileOptions
    from ninfer.passes.pipeline import compile_artifact
    from ninfer.runtime.executors.cpu.executor import Executor
    from ninfer.runtime.step import SeqChunk, StepBatch

    art = Artifact(target)
    tok = Tokenizer.from_str(art.tokenizer_json)
    texts = [p["prompt"] for p in json.loads(prompts.read_text(encoding="utf-8"))["prompts"]]
    ids = [tok.encode(t, add_special_tokens=False).ids for t in texts]
    llm = LLM(str(target), max_concurrency=8, kv_capacity=8192, max_context=2048)
    outs = llm.generate(ids, SamplingParams(max_tokens=400, temperature=0.0))
    llm.close()
    opts = CompileOptions(cpu_weights="float32", max_context=2048, capture=("final",))
    ex = Executor(compile_artifact(art, opts), art)
    data = []
    for prompt, out in zip(ids, outs):
        s = list(prompt) + list(out.token_ids)
        pages = tuple(range(-(-len(s) // ex.page_size)))
        logits = ex.run(StepBatch((SeqChunk(0, tuple(s), 0, pages),)), all_logits=True)
        data.append({
            "tokens": torch.tensor(s),
            "hidden": ex.hidden["final"].clone(),
            "greedy": logits.argmax(-1),
            "prompt": torch.tensor(len(prompt)),
        })  # fmt: skip
    return data


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rotate(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = pos[:, None].float() * inv[None]  # [T, d/2]
    cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]
    half = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1)
    return x * cos + half * sin


class Head:
    """The MTP head in torch (Qwen3 layer), on parameters named as the artifact stores them."""

    def __init__(self, params: dict[str, torch.Tensor], spec: Any, embed: torch.Tensor) -> None:
        self.p, self.s, self.embed = params, spec, embed

    def inputs(self, tokens: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        p, eps = self.p, self.s.eps
        e = _rms(self.embed[tokens], p["mtp.pre_fc_norm_embedding.weight"], eps)
        h = _rms(hidden, p["mtp.pre_fc_norm_hidden.weight"], eps)
        return torch.cat([e, h], -1) @ p["mtp.fc.weight"].T

    def qkv(self, x: torch.Tensor, pos: torch.Tensor):
        p, s, L = self.p, self.s, "mtp.layers.0."
        h = _rms(x, p[L + "input_layernorm.weight"], s.eps)
        q = (h @ p[L + "self_attn.q_proj.weight"].T).unflatten(-1, (s.heads, s.head_dim))
        k = (h @ p[L + "self_attn.k_proj.weight"].T).unflatten(-1, (s.kv_heads, s.head_dim))
        v = (h @ p[L + "self_attn.v_proj.weight"].T).unflatten(-1, (s.kv_heads, s.head_dim))
        q = _rotate(_rms(q, p[L + "self_attn.q_norm.weight"], s.eps), pos, s.rope["theta"])
        k = _rotate(_rms(k, p[L + "self_attn.k_norm.weight"], s.eps), pos, s.rope["theta"])
        return q, k, v

    def finish(self, x: torch.Tensor, q, k, v, mask: torch.Tensor) -> torch.Tensor:
        """The layer's output hidden after mtp.norm: x [T, H] with queries q attending to k, v
        [S, kv_heads, D] where mask [T, S] allows."""
        p, s, L = self.p, self.s, "mtp.layers.0."
        rep = s.heads // s.kv_heads
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        att = torch.einsum("thd,shd->hts", q, k) * s.head_dim**-0.5
        att = att.masked_fill(~mask[None], float("-inf")).softmax(-1)
        o = torch.einsum("hts,shd->thd", att, v).flatten(-2)
        x = x + o @ p[L + "self_attn.o_proj.weight"].T
        h = _rms(x, p[L + "post_attention_layernorm.weight"], s.eps)
        g, u = h @ p[L + "mlp.gate_proj.weight"].T, h @ p[L + "mlp.up_proj.weight"].T
        x = x + (F.silu(g) * u) @ p[L + "mlp.down_proj.weight"].T
        return _rms(x, p["mtp.norm.weight"], s.eps)

    def unrolled(self, tokens: torch.Tensor, hidden: torch.Tensor, steps: int) -> list:
        """Output hiddens of drafting steps 0..steps-1 at every position q (module docstring):
        step i at q reads (step i-1 output at q-1, token q+1). Rows without a valid input are
        garbage and excluded by the caller's labels."""
        t = tokens.shape[0] - 1  # positions 0..t-1 have a next token
        pos = torch.arange(t)
        nxt = tokens[1:]
        keys, vals, outs = [], [], []
        h_in = hidden[:t]
        for i in range(steps):
            x = self.inputs(nxt, h_in)
            q, k, v = self.qkv(x, pos)
            keys.append(k)
            vals.append(v)
            # step 0 keys at positions <= q - i; step m's keys (1..i) at position q - i + m
            masks = [pos[None, :] <= (pos[:, None] - i)]
            for m in range(1, i + 1):
                masks.append(pos[None, :] == (pos[:, None] - i + m))
            out = self.finish(x, q, torch.cat(keys), torch.cat(vals), torch.cat(masks, 1))
            outs.append(out)
            h_in = torch.cat([out[:1] * 0, out[:-1]])  # q reads step i's output at q - 1
        return outs


def train(data: list[dict[str, torch.Tensor]], art: Any, steps: int, log=print) -> dict:
    from ninfer.artifact.model_spec import model_spec

    torch.manual_seed(SEED)
    spec = model_spec(art.architecture, art.config)
    embed = torch.from_numpy(np.asarray(art.dense("model.embed_tokens.weight"), np.float32))
    params = {n: torch.tensor(a, requires_grad=True) for n, a in initial_head(art, SEED).items()}
    head = Head(params, spec, embed)
    opt = torch.optim.Adam(params.values(), lr=LR)
    t0 = time.monotonic()
    data = [_window(d) for d in data]
    for step in range(steps):
        opt.zero_grad()
        total, n, hits, counts = 0.0, 0, [0] * UNROLL, [0] * UNROLL
        for d in data:
            outs = head.unrolled(d["tokens"], d["hidden"], UNROLL)
            y = d["greedy"]  # y[p]: the target's greedy token after position p
            t = d["tokens"].shape[0] - 1
            first = int(d["prompt"]) - 1  # the first draft round reads position P - 1
            for i, out in enumerate(outs):
                # step i at q predicts the token after q + 1: y[q + 1]; drafting reaches it
                # for first + i <= q < t - 1
                q = torch.arange(max(i, first + i), t - 1)
                logits = out[q] @ embed.T
                loss = F.cross_entropy(logits, y[q + 1], reduction="sum")
                total = total + loss
                n += len(q)
                counts[i] += len(q)
                hits[i] += int((logits.argmax(-1) == y[q + 1]).sum())
        done = all(h >= 0.99 * c for h, c in zip(hits, counts))
        if step % 25 == 0 or step == steps - 1 or done:
            acc = " ".join(f"{h / c:.3f}" for h, c in zip(hits, counts))
            log(f"step {step:4d}  loss {float(total.detach()) / n:.4f}  accuracy per step {acc}  "
                f"{time.monotonic() - t0:.0f}s")  # fmt: skip
        if done:
            break
        (total / n).backward()
        opt.step()
    return {n: p.detach().numpy().copy() for n, p in params.items()}


def _window(d: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`d` from WINDOW positions before its first draft position on (rotary attention is
    relative, so the positions may start at 0): training then costs the continuations, not
    the long prompts."""
    start = max(0, int(d["prompt"]) - 1 - WINDOW)
    return {
        "tokens": d["tokens"][start:], "hidden": d["hidden"][start:],
        "greedy": d["greedy"][start:], "prompt": d["prompt"] - start,
    }  # fmt: skip


def draft_ranking(data: list[dict[str, torch.Tensor]], vocab: int) -> np.ndarray:
    """Token ids by their count in the target's greedy continuations, ties by id."""
    counts = np.zeros(vocab, dtype=np.int64)
    for d in data:
        cont = d["tokens"][int(d["prompt"]) :].numpy()
        np.add.at(counts, cont[cont < vocab], 1)
    return np.lexsort((np.arange(vocab), -counts)).astype(np.float32)


def digest(path: Path) -> str:
    """xxh3 of a file: which target a head was trained for."""
    import xxhash

    return xxhash.xxh3_64_hexdigest(path.read_bytes())


def build_head(head_path: Path, target: Path = TINY_AGENT, steps: int = STEPS, log=print) -> Path:
    """Train the head for `target` and write it (with the target's digest) to `head_path`."""
    from safetensors.numpy import save_file

    from ninfer.artifact.format import Artifact

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small ops: one thread is many times faster on a busy machine
    try:
        art = Artifact(target)
        data = distillation_data(target, TINY_AGENT_PROMPTS)
        head = train(data, art, steps, log)
    finally:
        torch.set_num_threads(threads)
    head["mtp.draft_vocab"] = draft_ranking(data, int(art.config["vocab_size"]))
    save_file(head, str(head_path), metadata={"target_xxh3": digest(target)})
    return head_path


def tiny_agent_mtp(root: Path, log=print) -> Path:
    """`root/tiny-agent-mtp.ninfer`: the tiny-agent fixture with the committed head attached,
    or with a freshly trained one when the fixture changed since the head was trained."""
    from safetensors import safe_open

    from ninfer.artifact.attach import attach_mtp, read_head
    from ninfer.ir.models import check_tensors

    out = Path(root) / "tiny-agent-mtp.ninfer"
    if out.exists():
        return out
    head = HEAD
    with safe_open(str(HEAD), "np") as f:
        trained_for = (f.metadata() or {}).get("target_xxh3")
    if trained_for != digest(TINY_AGENT):
        log(f"{HEAD.name} was trained for another tiny-agent.ninfer: training a new head")
        head = build_head(Path(root) / "tiny-agent.mtp.safetensors", log=log)
    return attach_mtp(TINY_AGENT, read_head(head), out, check_tensors, name="tiny-agent-mtp")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--head", type=Path, default=HEAD, help="the head to write (safetensors)")
    ap.add_argument("--target", type=Path, default=TINY_AGENT)
    ap.add_argument("--out", type=Path, help="also write the target with the head attached")
    ap.add_argument("--steps", type=int, default=STEPS)
    args = ap.parse_args(argv)
    build_head(args.head, args.target, args.steps)
    print(f"wrote {args.head}", file=sys.stderr)
    if args.out is not None:
        from ninfer.artifact.attach import attach_mtp, read_head
        from ninfer.ir.models import check_tensors

        attach_mtp(args.target, read_head(args.head), args.out, check_tensors)
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
