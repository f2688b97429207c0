"""GGUF tokenizer metadata -> `tokenizers` JSON, on small synthetic files, against transformers'
GGUF tokenizer: byte-level BPE with each known pre-tokenizer, and SentencePiece BPE."""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer

from ninfer.artifact.convert_gguf import read_metadata
from ninfer.artifact.gguf_tokenizer import byte_alphabet, gguf_tokenizer, spm_merges
from ninfer.errors import ConvertError

TEXTS = [
    "hello world",
    "1234 and 12345678, 3.4",
    "  hello  world \n\n\tx",
    "héllo 日本 😀",
    "<|im_start|>hello<|im_end|>\n",
    "<s></s><unk>",
    "",
    " ",
]


def ours(path) -> Tokenizer:
    from gguf import GGUFReader

    return Tokenizer.from_str(gguf_tokenizer(read_metadata(GGUFReader(path))).tokenizer_json)


def reference(path):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def write_spm_gguf(path, *, scores_from_file: bool = True, add_eos: bool = False):
    """A tiny llama SentencePiece vocabulary: <unk> <s> </s>, 256 byte tokens, scored pieces."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    pieces = ["▁", "e", "h", "l", "o", "w", "r", "d", "▁h", "he", "ll", "llo", "▁he", "▁hello"]
    pieces += ["▁w", "or", "▁wor", "▁world", "▁▁", "▁▁▁▁", "1", "2", "12", "<|user|>"]
    tokens += pieces
    types += [4 if p.startswith("<|") else 1 for p in pieces]
    scores = [0.0] * (3 + 256) + [-float(i) for i in range(len(pieces))]
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_scores(scores)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    if add_eos:
        w.add_add_eos_token(True)
    w.add_uint32("llama.block_count", 1)
    w.add_tensor("output_norm.weight", np.ones(8, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize(
    "pre",
    ["smollm", "gpt2", "llama-bpe", "qwen2", "qwen35", "falcon3", "tekken", "gpt-4o", "megrez"],
)
def test_byte_level_equals_transformers(tmp_path, write_gguf, pre):
    path = write_gguf(
        tmp_path / "model.gguf", {"output_norm.weight": (np.ones(64, np.float32), None)}, pre=pre
    )
    tok, ref = ours(path), reference(path)
    for text in TEXTS:
        ids = tok.encode(text).ids
        assert ids == ref(text)["input_ids"], (pre, text)
        assert tok.decode(ids, skip_special_tokens=False) == text


def test_pre_tokenizers_differ_on_digits(tmp_path, write_gguf):
    """The digit merges of the tiny vocabulary make each pre-tokenizer visible in the ids."""
    got = {}
    for pre in ("smollm", "llama-bpe", "qwen2"):
        path = write_gguf(tmp_path / f"{pre}.gguf", {}, pre=pre)
        got[pre] = [ours(path).id_to_token(i) for i in ours(path).encode("1234").ids]
    assert got == {"smollm": ["12", "34"], "llama-bpe": ["123", "4"], "qwen2": ["1", "2", "3", "4"]}


def test_sentencepiece_equals_transformers(tmp_path):
    path = write_spm_gguf(tmp_path / "model.gguf")
    tok, ref = ours(path), reference(path)
    for text in [*TEXTS, "<|user|>hello</s>x", "hello\n\nworld\t!"]:
        assert tok.encode(text).ids == ref(text)["input_ids"], text
    ids = tok.encode("hello world").ids
    assert ids[0] == 1  # BOS added by default for SentencePiece files
    assert tok.decode(ids) == "hello world"


def test_a_file_that_adds_eos_gets_it_appended(tmp_path):
    path = write_spm_gguf(tmp_path / "model.gguf", add_eos=True)
    tok, ref = ours(path), reference(path)
    for text in [*TEXTS, "<s>hello"]:  # BOS text at the start: a second BOS, as transformers
        assert tok.encode(text).ids == ref(text)["input_ids"], text
    assert tok.encode("hello").ids[-1] == 2


def test_spm_merges_order():
    tokens = ["a", "b", "c", "ab", "bc", "abc"]
    scores = [0.0, 0.0, 0.0, -1.0, -0.5, -2.0]
    # bc (score -.5) before ab (-1) before abc's two splits (-2), the longer left half first
    assert spm_merges(tokens, scores) == [["b", "c"], ["a", "b"], ["ab", "c"], ["a", "bc"]]


def test_byte_alphabet_is_a_bijection():
    table = byte_alphabet()
    assert len(table) == 256 and len(set(table.values())) == 256
    assert table[ord("A")] == "A" and table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ"


def test_chat_eos_includes_end_of_turn(tmp_path, write_gguf):
    from gguf import GGUFReader

    path = write_gguf(tmp_path / "model.gguf", {})
    tok = gguf_tokenizer(read_metadata(GGUFReader(path)))
    st = tok.special_tokens
    assert (
        st["eos_token_ids"][0] == 2 and 0 in st["eos_token_ids"]
    )  # <|im_end|>, then <|endoftext|>
    assert st["bos_token"] == "<|im_start|>" and st["add_bos"] is False
    assert tok.chat_template.startswith("{% for m in messages %}")


def test_unsupported_tokenizer_model():
    meta = {
        "tokenizer.ggml.model": "t5",
        "tokenizer.ggml.tokens": ["a", "b"],
        "tokenizer.ggml.token_type": [1, 1],
    }
    with pytest.raises(ConvertError) as e:
        gguf_tokenizer(meta)
    assert "t5" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConvertError):
        gguf_tokenizer({"general.architecture": "llama"})
