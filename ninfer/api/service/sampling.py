"""Sampler defaults: registered per-architecture presets by thinking mode, process flags, request.

Resolution order (docs/serving.md, "Sampling defaults"): the registered preset of the loaded
architecture for the request's resolved thinking mode (or, for an architecture without one, the
artifact's generation_config), then process flags (--temperature ...), then request fields;
--greedy finally forces temperature 0. A top_p of 0 (valid on every protocol) keeps only the
most likely token, so it resolves to exact argmax (temperature 0, top_p 1). On the HTTP surface
top_k is 0..20 and 0 selects the top-20 cap, so every sampled token comes from at most 20
candidates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ninfer.artifact.generation import FIELDS as _RECORDED
from ninfer.artifact.generation import PLAIN, effective_defaults

TOP_K_CAP = 20
FIELDS = tuple(_RECORDED)  # the sampler fields an artifact, a flag or a request may set

# (temperature, top_p, top_k, min_p, presence_penalty); frequency penalty is 0 for all.
_QWEN35_NON_THINKING = (0.7, 0.80, 20, 0.0, 1.5)
PRESETS: dict[str, dict[bool, tuple[float, float, int, float, float]]] = {
    "qwen3_5": {True: (1.0, 0.95, 20, 0.0, 0.0), False: _QWEN35_NON_THINKING},
    # the MoE (35B-A3B) preset differs only in its thinking presence penalty
    "qwen3_5_moe": {True: (1.0, 0.95, 20, 0.0, 1.5), False: _QWEN35_NON_THINKING},
}


@dataclass(frozen=True)
class SamplerPolicy:
    """Everything that decides a request's sampler besides the request itself."""

    architecture: str
    generation: dict[str, Any] = field(default_factory=dict)
    overrides: dict[str, Any] = field(default_factory=dict)  # process flags that were given
    greedy: bool = False

    def registered(self, thinking: bool) -> dict[str, Any]:
        """The preset for this architecture and mode, else the artifact's generation defaults."""
        preset = PRESETS.get(self.architecture, {}).get(thinking)
        if preset is not None:
            t, p, k, m, pp = preset
            return dict(PLAIN, temperature=t, top_p=p, top_k=k, min_p=m, presence_penalty=pp)
        return dict(effective_defaults(self.generation))

    def resolve(self, thinking: bool, request: dict[str, Any]) -> dict[str, Any]:
        """Final sampler fields (plus `seed`) for one request; `request` holds the request's
        fields, None meaning not given."""
        out = self.registered(thinking)
        out["seed"] = None
        out.update({k: v for k, v in self.overrides.items() if v is not None})
        out.update({k: v for k, v in request.items() if v is not None})
        if out["top_p"] is not None and out["top_p"] <= 0:
            # top_p 0 keeps only the most likely token, whatever the protocol: exact argmax
            out["temperature"], out["top_p"] = 0.0, 1.0
        if self.greedy:
            out["temperature"] = 0.0
        k = int(out["top_k"] or 0)
        out["top_k"] = TOP_K_CAP if k <= 0 else min(k, TOP_K_CAP)
        return out


@dataclass(frozen=True)
class SamplerDefaults:
    """Process-level sampling: artifact generation defaults overlaid by --temperature etc."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    greedy: bool = False

    @classmethod
    def resolve(cls, generation: dict[str, Any], overrides: dict[str, Any]) -> SamplerDefaults:
        base: dict[str, Any] = dict(effective_defaults(generation))
        base.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**base)
