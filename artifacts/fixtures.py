"""Tiny random test models: Llama, Qwen2, Qwen3, Qwen3-MoE, Qwen3.5 (dense and MoE).

`build_fixture(arch, root)` makes a seeded random model with transformers (hidden 64, 16-dim
heads, 4 query / 2 KV heads, vocab 512 from `artifacts.tokenizer`), saves it as a Hugging Face
directory `root/<arch>-hf/` (config.json, model.safetensors, tokenizer files, chat template,
generation_config.json) and converts it to `root/<arch>.ninfer`. Same arch, same bytes: every
random draw comes from a generator seeded by the arch name. Both steps reuse what is already
there, so a per-run cache directory makes repeated calls free.

Layouts on disk follow the real checkpoints of each family:

    llama        2 layers, tied embeddings (like SmolLM2)
    qwen2        3 layers, untied head, q/k/v biases, rope_theta 1e6, MLP 256 wide (so the
                 down projections hold whole K-quant blocks in the GGUF of fixture_gguf.py)
    qwen3        2 layers, tied embeddings, rope_theta 1e6 (like Qwen3-0.6B)
    qwen3_moe    2 layers, 8 experts top-2, normalised top-k, experts stored per expert
    qwen3_5      4 layers: linear, full, linear, full attention (Gated DeltaNet + gated attention)
    qwen3_5_moe  4 layers as qwen3_5, 8 experts top-2 plus a shared expert, experts stored
                 *fused* (`experts.gate_up_proj` [E, 2I, H], `experts.down_proj` [E, H, I])

Norm weights are perturbed away from their init (1, or 0 for Qwen3.5's zero-centred norms), and
biases away from 0, so a runtime that ignores a norm weight or a bias, or gets the (1 + w)
convention wrong, computes a different function. Command line: `python -m artifacts.fixtures OUTDIR [ARCH ...]`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from artifacts.tokenizer import (
    EOS_TOKEN,
    PAD_TOKEN,
    VOCAB_SIZE,
    build_tokenizer,
    save_tokenizer,
    token_id,
)

ARCHS = ("llama", "qwen2", "qwen3", "qwen3_moe", "qwen3_5", "qwen3_5_moe")

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
# the server's maintained Qwen-style template (ChatML, Qwen XML tool calls, <think>)
TEMPLATE = REPO / "ninfer" / "api" / "service" / "templates" / "qwen_xml.jinja"
TINY_AGENT = HERE / "fixtures" / "tiny-agent.ninfer"
TINY_AGENT_PROMPTS = HERE / "fixtures" / "tiny-agent.prompts.json"

_COMMON: dict[str, Any] = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "initializer_range": 0.08,  # wider than the 0.02 default: clearer argmax gaps for greedy tests
}
_DELTANET: dict[str, Any] = {
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,  # value head i reads key head i // 2
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
}


def chat_template() -> str:
    """Our Qwen-style chat template (ChatML, tools in the system block, Qwen XML tool calls)."""
    return TEMPLATE.read_text(encoding="utf-8")


def _seed(arch: str) -> int:
    return int.from_bytes(hashlib.sha256(arch.encode()).digest()[:4], "little")


def _model(arch: str):  # -> transformers PreTrainedModel
    """A seeded random transformers model of `arch` (float32, eval mode)."""
    import transformers as tf

    tok = build_tokenizer()
    ids = {
        "eos_token_id": token_id(tok, EOS_TOKEN),
        "pad_token_id": token_id(tok, PAD_TOKEN),
        "bos_token_id": None,
    }
    moe = {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
    if arch == "llama":
        cfg = tf.LlamaConfig(
            **_COMMON, **ids, num_hidden_layers=2, intermediate_size=128, tie_word_embeddings=True
        )
        cls = tf.LlamaForCausalLM
    elif arch == "qwen2":
        cfg = tf.Qwen2Config(
            **_COMMON, **ids, num_hidden_layers=3, intermediate_size=256, tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        )  # fmt: skip
        cls = tf.Qwen2ForCausalLM
    elif arch == "qwen3":
        cfg = tf.Qwen3Config(
            **_COMMON, **ids, num_hidden_layers=2, intermediate_size=128, tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        )  # fmt: skip
        cls = tf.Qwen3ForCausalLM
    elif arch == "qwen3_moe":
        cfg = tf.Qwen3MoeConfig(
            **_COMMON, **ids, **moe, num_hidden_layers=2, intermediate_size=128, norm_topk_prob=True,
            decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False,
        )  # fmt: skip
        cls = tf.Qwen3MoeForCausalLM
    elif arch == "qwen3_5":
        cfg = tf.Qwen3_5TextConfig(
            **_COMMON,
            **ids,
            **_DELTANET,
            num_hidden_layers=4,
            intermediate_size=128,
            tie_word_embeddings=False,
        )
        cls = tf.Qwen3_5ForCausalLM
    elif arch == "qwen3_5_moe":
        cfg = tf.Qwen3_5MoeTextConfig(
            **_COMMON, **ids, **_DELTANET, **moe, num_hidden_layers=4, shared_expert_intermediate_size=32,
            tie_word_embeddings=False,
        )  # fmt: skip
        cls = tf.Qwen3_5MoeForCausalLM
    else:
        raise ValueError(f"unknown fixture architecture {arch!r} (choose from {', '.join(ARCHS)})")
    return seeded_model(
        arch, cls, cfg, lambda name: name.endswith("norm.weight") or "layernorm" in name
    )


def seeded_model(arch: str, cls: Any, cfg: Any, is_norm: Callable[[str], bool]) -> Any:
    """`cls(cfg)` initialised from `arch`'s seed (the global RNG left as it was), then its norm
    weights (`is_norm(name)`) and biases moved off their init values (ones and zeros would let
    a wrong norm or a missing bias pass unseen); float32, eval mode."""
    import torch

    gen = torch.Generator().manual_seed(_seed(arch))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_seed(arch))
        model = cls(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if is_norm(name):
                p.add_(0.1 * torch.randn(p.shape, generator=gen))  # [n]: move norms off their init
            elif name.endswith(".bias"):
                p.add_(0.5 * torch.randn(p.shape, generator=gen))  # [n]: zero at init
    return model.float().eval()


def save_text_files(hf_dir: Path) -> None:
    """The text side of a fixture's Hugging Face directory beside its weights: the tokenizer
    (tokenizer.json, tokenizer_config.json, chat_template.jinja) and generation_config.json."""
    tok = save_tokenizer(hf_dir, chat_template())
    gen = generation_config(token_id(tok, EOS_TOKEN), token_id(tok, PAD_TOKEN))
    (hf_dir / "generation_config.json").write_text(
        json.dumps(gen, indent=2) + "\n", encoding="utf-8"
    )


def generation_config(eos: int, pad: int) -> dict[str, Any]:
    return {
        "bos_token_id": None,
        "eos_token_id": [eos, pad],
        "pad_token_id": pad,
        "do_sample": True,
        "temperature": 0.6,
        "top_p": 0.95,
        "top_k": 20,
    }


def hf_dir_once(arch: str, root: str | os.PathLike[str], write: Callable[[Path], None]) -> Path:
    """`root/<arch>-hf/`, written by `write(tmp)` into a private temporary directory and then
    renamed into place, so that concurrent builders (pytest-xdist workers) never see half a
    directory; built once, then reused."""
    root = Path(root)
    out = root / f"{arch}-hf"
    if (out / "config.json").exists():
        return out
    tmp = root / f".{arch}-hf.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    write(tmp)
    try:
        tmp.rename(out)
    except OSError:  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def save_fused_experts(model: Any, tmp: Path, *, drop_tied_head: bool = False) -> None:
    """Rewrite `tmp`'s weights as one safetensors file of the model's state dict: transformers
    saves MoE experts one by one, real Qwen3.5-MoE checkpoints keep them fused."""
    from safetensors.torch import save_file

    for f in tmp.glob("*.safetensors*"):
        f.unlink()
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if drop_tied_head and model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})


def convert_once(
    arch: str, root: str | os.PathLike[str], build_hf: Callable[[str, Path], Path]
) -> Path:
    """`root/<arch>.ninfer`, converted from `build_hf(arch, root)` (built once, then reused)."""
    from ninfer.artifact.convert_hf import convert_hf
    from ninfer.ir.models import check_tensors

    out = Path(root) / f"{arch}.ninfer"
    if out.exists():
        return out
    hf = build_hf(arch, Path(root))
    return convert_hf(hf, out, name=f"tiny-{arch}", check_model=check_tensors)


def build_hf_dir(arch: str, root: str | os.PathLike[str]) -> Path:
    """`root/<arch>-hf/`: the Hugging Face directory of the fixture (built once, then reused)."""

    def write(tmp: Path) -> None:
        model = _model(arch)
        model.save_pretrained(tmp)
        if arch == "qwen3_5_moe":
            save_fused_experts(model, tmp, drop_tied_head=True)
        if arch == "qwen3_moe":
            # transformers 5 writes `num_local_experts`; Qwen3-MoE checkpoints on the Hub say `num_experts`
            cfg = json.loads((tmp / "config.json").read_text(encoding="utf-8"))
            cfg["num_experts"] = cfg.pop("num_local_experts", cfg.get("num_experts"))
            (tmp / "config.json").write_text(
                json.dumps(cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8"
            )
        save_text_files(tmp)

    return hf_dir_once(arch, root, write)


def build_fixture(arch: str, root: str | os.PathLike[str]) -> Path:
    """`root/<arch>.ninfer`, converted from `build_hf_dir(arch, root)` (built once, then reused)."""
    if arch not in ARCHS:
        raise ValueError(f"unknown fixture architecture {arch!r} (choose from {', '.join(ARCHS)})")
    return convert_once(arch, root, build_hf_dir)


def fixture_cli(
    argv: list[str] | None,
    module: str,
    doc: str | None,
    archs: tuple[str, ...],
    build: Callable[[str, Path], Path],
) -> int:
    """`python -m MODULE OUTDIR [ARCH ...]` (described by the first line of `doc`): build each
    fixture of `archs` named (default: all) into OUTDIR with `build(arch, outdir)` and print its
    path; an unknown ARCH is a usage error."""
    p = argparse.ArgumentParser(
        prog=f"python -m {module}", description=(doc or "").splitlines()[0] if doc else None
    )
    p.add_argument("outdir", type=Path)
    p.add_argument(
        "archs", nargs="*", metavar="ARCH", help=f"any of {', '.join(archs)} (default: all)"
    )
    args = p.parse_args(argv)
    for arch in args.archs:
        if arch not in archs:
            p.error(f"unknown architecture {arch!r} (choose from {', '.join(archs)})")
    args.outdir.mkdir(parents=True, exist_ok=True)
    for arch in args.archs or archs:
        print(build(arch, args.outdir))
    return 0


def main(argv: list[str] | None = None) -> int:
    return fixture_cli(argv, "artifacts.fixtures", __doc__, ARCHS, build_fixture)


if __name__ == "__main__":
    sys.exit(main())
