"""Generation defaults: the sampling values a model's authors recommend, recorded in the artifact.

The artifact header's `generation` object holds them (format v3 has always had the field; an
artifact without it, or with an empty one, samples with the plain defaults below). Where they
come from at convert time:

- a Hugging Face directory: `generation_config.json`, stored as it is (the keys ninfer samples
  with are read from it: temperature, top_p, top_k, min_p; `do_sample: false` means greedy);
- a GGUF file: its `general.sampling.*` keys (temp, top_p, top_k, min_p), when present;
- either, overridden by `ninfer convert --generation-defaults temperature=0.2,top_p=0.9`;
- the embedded demo model: its model card's recommendation (see ninfer/artifact/demo.py).

`effective_defaults(artifact.generation)` is the one place that turns the recorded object into
sampler values; the server and `ninfer.LLM` both start from it when a request leaves a field out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# The fields a recorded default may set, with their ranges (the HTTP fields' ranges).
FIELDS: dict[str, tuple[type, float, float]] = {
    "temperature": (float, 0.0, 100.0),
    "top_p": (float, 0.0, 1.0),
    "top_k": (int, -1, 1 << 31),
    "min_p": (float, 0.0, 1.0),
    "presence_penalty": (float, -2.0, 2.0),
    "frequency_penalty": (float, -2.0, 2.0),
}

# What a request gets when neither it nor the artifact says otherwise (OpenAI's defaults).
PLAIN: dict[str, float | int] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}

# GGUF general.sampling.* key -> field (llama.cpp writes these from generation_config.json;
# penalty_repeat is a multiplicative repetition penalty, which ninfer does not implement).
GGUF_KEYS = {
    "general.sampling.temp": "temperature",
    "general.sampling.top_p": "top_p",
    "general.sampling.top_k": "top_k",
    "general.sampling.min_p": "min_p",
}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def effective_defaults(generation: Mapping[str, Any] | None) -> dict[str, float | int]:
    """The sampler defaults an artifact's `generation` object gives: PLAIN overlaid by every
    recorded field of FIELDS that holds a number in range (others are ignored, as transformers
    ignores what it does not know), with temperature 0 when it records `do_sample: false`."""
    out = dict(PLAIN)
    for key, (kind, lo, hi) in FIELDS.items():
        v = (generation or {}).get(key)
        if _number(v) and lo <= v <= hi and (kind is float or float(v).is_integer()):
            out[key] = kind(v)
    if (generation or {}).get("do_sample") is False:
        out["temperature"] = 0.0
    return out


def from_gguf(meta: Mapping[str, Any]) -> dict[str, float | int]:
    """The generation defaults a GGUF's metadata records (`general.sampling.*`), else {}."""
    out: dict[str, float | int] = {}
    for key, name in GGUF_KEYS.items():
        v = meta.get(key)
        if _number(v):
            out[name] = int(v) if FIELDS[name][0] is int else float(v)
    return out


def parse_defaults(text: str, *, option: str = "--generation-defaults") -> dict[str, float | int]:
    """`temperature=0.2,top_p=0.9` as a dict; ValueError naming `option` and the bad item."""
    out: dict[str, float | int] = {}
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        name, eq, value = item.partition("=")
        name = name.strip()
        if not eq or name not in FIELDS:
            raise ValueError(
                f"{option} {item!r}: expected NAME=VALUE with NAME one of {', '.join(FIELDS)}"
            )
        kind, lo, hi = FIELDS[name]
        try:
            number = kind(value.strip())
        except ValueError:
            raise ValueError(f"{option} {name}={value}: not a {kind.__name__}") from None
        if not lo <= number <= hi:
            raise ValueError(f"{option} {name}={value}: outside {lo:g}..{hi:g}")
        out[name] = number
    if not out:
        raise ValueError(f"{option}: give at least one NAME=VALUE (e.g. temperature=0.2)")
    return out


def artifact_defaults(artifact: Any) -> dict[str, float | int]:
    """`effective_defaults` of an open Artifact (or anything with a `generation` mapping)."""
    return effective_defaults(getattr(artifact, "generation", None))
