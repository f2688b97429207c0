"""`--spec mtp` on a vision plan (--vision, the Qwen3.5 vision-language fixtures with an MTP
head): the head reads what vLLM's Qwen3.5 MTP drafter reads — the target's hidden rows, the
NEXT token's embedding where that token is an image placeholder being the vision tower's
embedding the target merged there, and the target's 3-axis (MRoPE) positions — checked
against a reference built from transformers' own modules; and greedy output with images in the
prompt is token-for-token the output without speculation (one request, a batch of three with
different images and one without, pauses under a tiny KV pool). `--spec dflash` applies to a
vision plan too: its drafter reads the target's hidden rows, and its own rotary runs over
sequence indices of its own context (ninfer/spec/dflash.py), so the output is plain decoding's.
"""

from __future__ import annotations

import functools

import pytest
import torch

from ninfer.artifact.format import Artifact
from ninfer.passes.pipeline import compile_artifact
from ninfer.runtime.config import EngineOptions
from ninfer.runtime.executors.choose import make_executor
from ninfer.runtime.executors.sampler import Sampler
from ninfer.runtime.request import Request, SamplingParams
from ninfer.runtime.step import SeqChunk, StepBatch
from ninfer.runtime.vision.mrope import MRope
from ninfer.spec.build import build_speculator
from ninfer.spec.drafter import DraftRow
from tests.runtime.real_engine import settled
from tests.spec.spec_engine import check_counters, make_engine, run
from tests.vision.media_prompts import MediaPrompt, PromptBuilder, png

K = 3
PAGE = 16


def _prompt(path, text: str, seed: int | None, width: int = 40) -> MediaPrompt:
    b = PromptBuilder(path).text(text)
    if seed is not None:
        b = b.image(png(width, 56, seed=seed))
    return b.text(" Say more.").build()


def _requests(path, n: int) -> list[Request]:
    """Three prompts: two images of different sizes (9 and 12 placeholders) and one without."""
    out = []
    for text, seed, width, m in [("Hello, look here: ", 10, 40, 24),
                                 ("The weather today ", None, 40, 20),
                                 ("Numbers: 1 2 3 ", 11, 56, 22)][:n]:  # fmt: skip
        p = _prompt(path, text, seed, width)
        params = SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True)
        out.append(Request(tuple(p.ids), params, media=p.spans))
    return out


def _plain_and_spec(path, n: int, spec: dict, **options):
    options = {"vision": True, "max_concurrency": n, **options}
    with make_engine(path, None, **options) as plain:
        want = run(plain, _requests(path, n))
    with make_engine(path, None, draft_tokens=K, **spec, **options) as engine:
        outs = run(engine, _requests(path, n))
        stats = settled(engine)
    assert [o.error for o in outs] == [None] * n
    return want, outs, stats


@pytest.mark.parametrize(("arch", "n"), [("qwen3_5_vl", 1), ("qwen3_5_vl", 3),
                                         ("qwen3_5_moe_vl", 3)])  # fmt: skip
def test_greedy_mtp_with_images_equals_plain_decoding(arch, n, mtp_artifacts):
    path = mtp_artifacts(arch)
    want, outs, stats = _plain_and_spec(path, n, {"spec": "mtp"})
    assert [o.token_ids for o in outs] == [o.token_ids for o in want]
    check_counters(outs, stats, K, "mtp")
    assert stats.spec_decode_rounds_total > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("lm_head_draft", [False, True])
def test_greedy_mtp_with_images_on_cuda_equals_plain_decoding(lm_head_draft, mtp_artifacts):
    """The vision head on the CUDA executor (3-axis rotary, the target's vision embeddings
    merged in the head's graph): a batch of three image and text prompts, float32."""
    path = mtp_artifacts("qwen3_5_vl")
    spec = {"spec": "mtp", "lm_head_draft": lm_head_draft}
    want, outs, stats = _plain_and_spec(path, 3, spec, device="cuda", dtype="float32")
    assert [o.token_ids for o in outs] == [o.token_ids for o in want]
    check_counters(outs, stats, K, "mtp")


@pytest.mark.parametrize("route", ["replay", "snapshot"])
def test_pauses_of_media_requests_change_nothing(route, mtp_artifacts):
    """Five pages for three image prompts that need three each: the youngest are paused
    (replay re-encodes the image; a snapshot keeps the computed state) while others draft."""
    path = mtp_artifacts("qwen3_5_vl")
    pool = {"kv_capacity": 5 * PAGE, "page_size": PAGE, "prefill_chunk": PAGE,
            "prefix_reuse": False, "host_context_mib": 0 if route == "replay" else 64}  # fmt: skip
    want, outs, stats = _plain_and_spec(path, 3, {"spec": "mtp"}, **pool)
    assert [o.token_ids for o in outs] == [o.token_ids for o in want]
    assert stats.preemptions_total > 0, stats
    check_counters(outs, stats, K, "mtp")


def test_greedy_dflash_with_images_equals_plain_decoding(fixture_root):
    from artifacts.fixture_dflash import build_dflash_fixture
    from artifacts.fixture_vision import build_vision_fixture

    path = build_dflash_fixture(build_vision_fixture("qwen3_5_vl", fixture_root), fixture_root)
    assert Artifact(path).components == ["text", "vision", "dflash"]
    want, outs, stats = _plain_and_spec(path, 3, {"spec": "dflash"})
    assert [o.token_ids for o in outs] == [o.token_ids for o in want]
    check_counters(outs, stats, K, "dflash")
    assert stats.spec_decode_rounds_total > 0


# -- the head's function, against transformers' modules ------------------------------------------
@functools.cache
def _reference(hf_dir: str):
    import transformers as tf

    return tf.Qwen3_5ForConditionalGeneration.from_pretrained(hf_dir).float().eval()


def _reference_head(hf_dir, prompt: MediaPrompt, nxt: int, base: int) -> torch.Tensor:
    """The head's output rows [len(prompt) - base, hidden] at positions base.. as vLLM's
    Qwen3.5 MTP computes them: fc(concat[norm(embedding of token p + 1, the vision embedding
    at a placeholder), norm(target final hidden at p)]), one Qwen3.5 full-attention layer
    (mtp.layers.0) over the target's 3-axis positions of p, attending to positions base..p,
    and mtp.norm. Built from transformers' own modules; mtp.safetensors is the head."""
    from safetensors.torch import load_file
    from transformers.models.qwen3_5 import modeling_qwen3_5 as m

    ref = _reference(str(hf_dir))
    tc = ref.config.text_config
    w = load_file(str(hf_dir / "mtp.safetensors"))
    kw = prompt.reference_inputs()
    ids = torch.tensor([prompt.ids + [nxt]])
    model = ref.model
    hidden = model(**kw).last_hidden_state[0]  # after the final norm
    embeds = model.get_input_embeddings()(ids)[0]
    image = model.get_image_features(kw["pixel_values"], kw["image_grid_thw"], return_dict=True)
    embeds[ids[0] == ref.config.image_token_id] = torch.cat(image.pooler_output)
    pos, _ = model.get_rope_index(kw["input_ids"], kw["mm_token_type_ids"], kw["image_grid_thw"])

    def norm(name: str):
        n = m.Qwen3_5RMSNorm(tc.hidden_size, eps=tc.rms_norm_eps)
        n.weight.data = w[name]
        return n

    layer = m.Qwen3_5DecoderLayer(tc, layer_idx=tc.layer_types.index("full_attention"))
    pre = "mtp.layers.0."
    layer.load_state_dict({k[len(pre) :]: v for k, v in w.items() if k.startswith(pre)})
    e = norm("mtp.pre_fc_norm_embedding.weight")(embeds[base + 1 :])
    h = norm("mtp.pre_fc_norm_hidden.weight")(hidden[base:])
    x = (torch.cat([e, h], -1) @ w["mtp.fc.weight"].T)[None]
    rope = model.language_model.rotary_emb(x, pos[:, :, base:])
    t = x.shape[1]
    causal = torch.full((t, t), float("-inf")).triu(1)[None, None]
    out = layer.float().eval()(x, rope, attention_mask=causal)
    return norm("mtp.norm.weight")(out[0] if isinstance(out, tuple) else out)[0]


@torch.no_grad()
def test_the_head_reads_the_targets_positions_and_vision_embeddings(mtp_artifacts, mtp_hf_dirs):
    """The target prefills an image prompt in two chunks (the image across their boundary);
    the head (catch-up chunks of 16) then drafts from every position (base 0), and, for a
    second sequence given only the second chunk's rows (as after a reused prefix), from
    position 16 on: its rows and draft are the reference's, at 3-axis positions and with the
    image's embeddings where the next token is a placeholder."""
    path, hf_dir = mtp_artifacts("qwen3_5_vl"), mtp_hf_dirs("qwen3_5_vl")
    art = Artifact(path)
    opts = EngineOptions.of(
        vision=True, spec="mtp", draft_tokens=1, max_concurrency=2, kv_capacity=256,
        max_context=256, page_size=PAGE, prefill_chunk=PAGE,
    )  # fmt: skip
    target = make_executor(compile_artifact(art, opts.compile), art, "cpu")
    drafter = build_speculator(art, opts, target).drafter
    prompt = _prompt(path, "Hello, look here: ", seed=10)
    ids, n, (span,) = prompt.ids, len(prompt.ids), prompt.spans
    assert span.offset < PAGE < span.end < n  # the image straddles the chunks
    chunks = [
        SeqChunk(0, tuple(ids[a:b]), a, (0, 1), 0, want_logits=b == n, media=(span,),
                 mrope=MRope.of(prompt.spans))
        for a, b in ((0, PAGE), (PAGE, n))
    ]  # fmt: skip
    for c in chunks:
        logits = target.run(StepBatch((c,)))
        drafter.observe(StepBatch((c,)), target.hidden)
    reused = SeqChunk(1, chunks[1].token_ids, PAGE, (2, 3), media=(span,), mrope=chunks[1].mrope)
    drafter.observe(StepBatch((reused,)), target.hidden)  # no rows before position 16
    nxt = int(logits[-1].argmax())
    greedy = SamplingParams(max_tokens=4, temperature=0.0)
    for seq, base in ((0, 0), (1, PAGE)):
        row = DraftRow(seq, ids + [nxt], n, 1, greedy)
        (draft,) = drafter.propose([row], Sampler())
        got = drafter.executor.hidden["final"]  # the last head chunk: positions .. n - 1
        want = _reference_head(hf_dir, prompt, nxt, base)
        assert (got - want[-got.shape[0] :]).abs().max().item() < 1e-4, (seq, base)
        assert draft.tokens == (int(_reference(str(hf_dir)).lm_head(want[-1]).argmax()),)


def test_compile_shows_the_heads_media_and_positions(mtp_artifacts, capsys):
    from ninfer.cli import main

    path = mtp_artifacts("qwen3_5_vl")
    assert main(["compile", str(path), "--vision", "--spec", "mtp"]) == 0
    head = capsys.readouterr().out.split("== mtp (--spec mtp drafter stage) ==\n")[1]
    assert "media: the target's vision embeddings at next-token placeholders, mrope=3-axis" in head
    assert "torch.media_mergex1" in head
    assert main(["compile", str(path), "--spec", "mtp"]) == 0  # no --vision: a text head
    assert "media:" not in capsys.readouterr().out
