"""Constrained decoding: JSON mode, JSON Schema, grammars, regexes and tool calls enforced by a
token mask the sampler applies (docs/constrained-decoding.md).

    info = TokenizerInfo.from_artifact(artifact)          # once per engine
    constraint = compile_constraint(JsonSchema(schema), info)   # once per request (may raise
                                                           # ConstraintError -> HTTP 400)
    m = constraint.matcher(thinking=False)                  # once per sequence
    masks.fill([m, None, ...]); apply_bitmask(logits, masks.bitmask, rows)   # every step
    m.advance(token)                                        # every committed token

The engine does the per-step part through `ninfer.constrain.state.ConstraintState` (one matcher
per sequence, the step's mask, feeding committed tokens back).
"""

from __future__ import annotations

from ninfer.constrain.bitmask import BatchMasks, apply_bitmask
from ninfer.constrain.compile import Constraint, compile_constraint
from ninfer.constrain.errors import ConstraintError
from ninfer.constrain.matcher import Matcher
from ninfer.constrain.spec import (
    ConstraintSpec,
    ForcedToolCall,
    Grammar,
    JsonObject,
    JsonSchema,
    Regex,
    StrictTools,
    ToolSpec,
)
from ninfer.constrain.tokenizer_info import TokenizerInfo

__all__ = [
    "BatchMasks",
    "Constraint",
    "ConstraintError",
    "ConstraintSpec",
    "ForcedToolCall",
    "Grammar",
    "JsonObject",
    "JsonSchema",
    "Matcher",
    "Regex",
    "StrictTools",
    "TokenizerInfo",
    "ToolSpec",
    "apply_bitmask",
    "compile_constraint",
]
