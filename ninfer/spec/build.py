"""The speculator `build_engine` attaches for `EngineOptions.spec`.

    --spec draft --draft-model ARTIFACT
        the draft artifact (a .gguf / HF directory converted once, as `ninfer serve` does)
            ──compile_artifact(options.compile)──▶ its plan ──make_executor──▶
        its executor (its own KV pages) ──▶ DraftModelDrafter ──▶ Speculator

    --spec mtp [--lm-head-draft]
        the artifact's mtp component ──compile_mtp(options.compile)──▶ the head's own plan
        ──make_executor──▶ its executor (its own KV pages; the embedding and LM head the
        target's tensors, shared) ──▶ MtpDrafter ──▶ Speculator
        (the target plan captures "final" hidden states: EngineOptions adds the capture;
        --lm-head-draft: the head's logits over draft_vocab's frequency-ranked subset;
        --vision: the head reads the target's 3-axis positions and vision embeddings, its
        executor taking them from the target's media encoder: ninfer/spec/mtp_media.py)

Refused at startup, each with a one-line ConfigError: a draft model whose tokenizer differs
from the target's (the drafts would be other tokens) and a hybrid draft model (its own state
would need the same rollback). A hybrid (Gated DeltaNet) target speculates on CPU and CUDA
alike: its verify chunks write the state after each position into the lane's round slots.
`--spec mtp` on an artifact without an mtp component is refused (ConfigError naming it; the
server checks components first).

    --spec dflash
        the artifact's dflash component (ninfer/artifact/dflash.py) ──▶ DFlashDrafter, which
        reads the target's hidden states of its target layers (`target_compile_options` adds
        their capture to the target plan) and the target's embedding and LM head
        (ninfer/spec/dflash.py); refused without the component, as --spec mtp
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import torch

from ninfer.errors import ConfigError
from ninfer.passes.options import CompileOptions
from ninfer.runtime.config import EngineOptions
from ninfer.spec.draft_model import DraftModelDrafter
from ninfer.spec.mtp import MtpDrafter
from ninfer.spec.speculator import Speculator


def _vocab(tokenizer_json: str) -> Any:
    """What decides token ids: the model's vocabulary, merges and added tokens."""
    data = json.loads(tokenizer_json) if tokenizer_json else {}
    model = data.get("model", {})
    added = sorted((t.get("id"), t.get("content")) for t in data.get("added_tokens", []))
    return model.get("vocab"), model.get("merges"), added


def target_compile_options(artifact: Any, options: EngineOptions) -> CompileOptions:
    """The target plan's compile options: `options.compile`, plus (--spec dflash) the capture
    of the hidden states the artifact's DFlash drafter reads."""
    if options.spec != "dflash":
        return options.compile
    from ninfer.spec.dflash import dflash_capture

    extra = tuple(c for c in dflash_capture(artifact) if c not in options.compile.capture)
    if not extra:
        return options.compile
    return dataclasses.replace(options.compile, capture=options.compile.capture + extra)


def build_speculator(artifact: Any, options: EngineOptions, executor: Any) -> Speculator | None:
    """The speculator of `options.spec` for `artifact` served by `executor` (None: off)."""
    if options.spec is None:
        return None
    from ninfer.artifact.cache import servable_path
    from ninfer.artifact.format import Artifact
    from ninfer.ir.models import check_tensors
    from ninfer.passes.pipeline import compile_artifact
    from ninfer.runtime.executors.choose import make_executor

    if options.spec == "mtp":
        return Speculator(_mtp_drafter(artifact, options, executor))
    if options.spec == "dflash":
        from ninfer.spec.dflash import build_dflash_drafter

        return Speculator(build_dflash_drafter(artifact, executor, options.lm_head_draft))
    assert options.spec == "draft" and options.draft_model is not None
    # a .ninfer as it is; a .gguf or Hugging Face directory converted once into the cache
    draft = Artifact(servable_path(options.draft_model, check_model=check_tensors))
    if _vocab(draft.tokenizer_json) != _vocab(getattr(artifact, "tokenizer_json", "")):
        raise ConfigError(
            f"--draft-model {options.draft_model}: its tokenizer differs from the served"
            " model's; a draft model must share the target's tokenizer"
        )
    plan = compile_artifact(draft, options.compile)
    draft_executor = make_executor(plan, draft, options.device)
    if draft_executor.is_hybrid:
        raise ConfigError(
            f"--draft-model {options.draft_model}: {draft.architecture} is a hybrid (Gated"
            " DeltaNet) model; use an attention-only draft model"
        )
    return Speculator(DraftModelDrafter(draft_executor, max_chunk=options.prefill_chunk))


def _share_weights(head: Any, target: Any) -> None:
    """The head plan's copies of weights the target also loaded (the embedding, the LM head)
    replaced by the target's, loaded the same way: one copy in memory."""
    mine, theirs = getattr(head, "weights", None), getattr(target, "weights", None)
    if not isinstance(mine, dict) or not isinstance(theirs, dict):
        return
    for name, w in mine.items():
        t = theirs.get(name)
        if t is None or type(t) is not type(w):
            continue
        if isinstance(w, torch.Tensor) and (w.shape != t.shape or w.dtype != t.dtype):
            continue
        mine[name] = t


def _mtp_drafter(artifact: Any, options: EngineOptions, target: Any) -> MtpDrafter:
    """The MTP head of `artifact` on its own executor (module docstring)."""
    from ninfer.passes.pipeline import compile_mtp
    from ninfer.runtime.executors.choose import make_executor

    if "mtp" not in getattr(artifact, "components", ()):
        have = ", ".join(getattr(artifact, "components", ())) or "none"
        raise ConfigError(
            f"--spec mtp needs the artifact's mtp component, but it has only {have}; drop"
            " --spec or convert a checkpoint with MTP weights"
        )
    plan = compile_mtp(artifact, options.compile, logits=not options.lm_head_draft)
    executor = make_executor(plan, artifact, options.device)
    _share_weights(executor, target)
    media = target.media if executor.merges_media else None
    kw = {"max_chunk": options.prefill_chunk, "target_media": media,
          "wide_rows": options.compile.verify_rows}  # fmt: skip
    if not options.lm_head_draft:
        return MtpDrafter(executor, **kw)
    from ninfer.spec.draft_vocab import build_draft_head

    head = build_draft_head(artifact, executor.dtype, executor.device)
    return MtpDrafter(
        executor, vocab=head.ids, head=head, vocab_size=int(plan.model["vocab"]), **kw
    )
