"""Write a random-weight `.ninfer` artifact of a real model shape, on the machine that serves it.

No real weights can be fetched where the GPU is, and only a few MB can be carried there, so this
script makes the file in place: the synthetic model of `ninfer bench --synthetic NAME` (random
initialisation of the real config, made on `--device`), stored exactly as `ninfer convert
--weights W` would store it, with the tiny test tokenizer (its ids fit every vocabulary) and
ninfer's built-in Qwen-style chat template, so `ninfer serve OUT` answers Chat Completions.

    python -m artifacts.random_artifact qwen3-8b -o /tmp/qwen3-8b-fp8.ninfer --weights fp8 --device cuda
    python -m artifacts.random_artifact qwen3.5-9b-hybrid -o /tmp/q35.ninfer --device cuda

Tensors stream to disk one at a time (ArtifactWriter), so host memory stays small.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

from ninfer.api.service.template import TEMPLATES_DIR
from ninfer.artifact.format import ArtifactWriter, StoredTensor


def _numpy(t: torch.Tensor) -> np.ndarray:
    """A part as the artifact stores it: bf16 and float8 as their raw bit patterns."""
    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return t.view(torch.uint8).numpy()
    return t.numpy()


def write_random_artifact(
    name: str, out: str | Path, *, weights: str = "bf16", device: str = "cpu", seed: int = 0
) -> Path:
    from artifacts.tokenizer import EOS_TOKEN, build_tokenizer, token_id
    from ninfer.bench.synthetic import build_synthetic

    source, model = build_synthetic(name, weights, device, seed=seed)
    del model  # only the stored parts are written
    tok = build_tokenizer()
    eos = token_id(tok, EOS_TOKEN)
    header = {
        "metadata": {"name": f"random-{name}-{weights}", "source": "random", "seed": seed},
        "architecture": source.architecture,
        "config": source.config,
        "tokenizer": tok.to_str(),
        "chat_template": (TEMPLATES_DIR / "qwen_xml.jinja").read_text(encoding="utf-8"),
        "special_tokens": {"bos_token": None, "bos_token_id": None, "eos_token": EOS_TOKEN,
                           "eos_token_ids": [eos], "pad_token_id": None, "add_bos": False},
        "generation": {},
        "components": ["text"],
    }  # fmt: skip
    with ArtifactWriter(out, header) as writer:
        for tname, info in source.tensors.items():
            parts = {
                k: _numpy(v) for k, v in source.device_parts(tname, torch.device("cpu")).items()
            }
            writer.add(tname, StoredTensor(info.format, tuple(info.shape), parts))
    return Path(out)


def main(argv: list[str] | None = None) -> int:
    from ninfer.bench.synthetic import SYNTHETIC, WEIGHTS

    p = argparse.ArgumentParser(
        prog="python -m artifacts.random_artifact", description=__doc__.splitlines()[0]
    )
    p.add_argument("name", choices=sorted(SYNTHETIC))
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--weights", choices=WEIGHTS, default="bf16")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    t0 = time.monotonic()
    path = write_random_artifact(
        args.name, args.output, weights=args.weights, device=args.device, seed=args.seed
    )
    print(
        f"wrote {path} ({path.stat().st_size / 2**30:.2f} GiB) in {time.monotonic() - t0:.1f} s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
