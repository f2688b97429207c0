"""`LLM.tokenizer.encode` adds special tokens as transformers' tokenizer does for the same
tokenizer.json and tokenizer_config.json: the post-processor decides (Llama 3's BOS template
without add_bos_token; the add_bos_token / add_eos_token flags alone add nothing), and a text
that starts with the BOS token's text gets a second BOS."""

from __future__ import annotations

import json

import pytest
from tokenizers import processors

from artifacts.tokenizer import build_tokenizer
from ninfer.artifact.convert_hf import special_tokens
from ninfer.runtime.tokenizer import Tokenizer

TEXTS = ["Hello there", "<|endoftext|>Hi", "", " x\n\ny", "<|im_end|> tail"]


@pytest.mark.parametrize(
    "template, config",
    [
        ("<|endoftext|> $A", {}),  # Llama 3: BOS from the post-processor only
        ("<|endoftext|> $A", {"add_bos_token": True}),  # both say so: one BOS
        ("$A", {"add_bos_token": True}),  # the flag alone
        ("$A", {"add_bos_token": True, "add_eos_token": True}),
        ("<|endoftext|> $A <|im_end|>", {}),
        ("$A", {}),
    ],
)
def test_encode_adds_special_tokens_like_transformers(tmp_path, template, config):
    transformers = pytest.importorskip("transformers")
    tok = build_tokenizer()
    specials = [(t, tok.token_to_id(t)) for t in ("<|endoftext|>", "<|im_end|>") if t in template]
    tok.post_processor = processors.TemplateProcessing(single=template, special_tokens=specials)
    tok.save(str(tmp_path / "tokenizer.json"))
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|endoftext|>",
        "eos_token": "<|im_end|>",
        **config,
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    ref = transformers.AutoTokenizer.from_pretrained(tmp_path)
    tok_json = (tmp_path / "tokenizer.json").read_text()
    ours = Tokenizer(tok_json, special_tokens(tok_json, tok_cfg, {}, {}))
    for text in TEXTS:
        assert ours.encode(text) == ref(text)["input_ids"], text
        assert (
            ours.encode(text, add_special_tokens=False)
            == ref(text, add_special_tokens=False)["input_ids"]
        )
