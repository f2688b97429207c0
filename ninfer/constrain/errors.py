"""The error a request's constraint can cause: a schema, grammar or regex that is invalid or
that the grammar engine cannot enforce. The API turns it into a 400 naming `path`."""

from __future__ import annotations

from ninfer.errors import NinferError


class ConstraintError(NinferError):
    """A constraint the client sent cannot be compiled. `path` names where in the request the
    bad part is, as the client wrote it (e.g.
    `response_format.json_schema.schema.properties.age.type`); `reason` says what is wrong."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


def join_path(base: str, parts: object) -> str:
    """`base` extended by schema path parts: names become `.name`, indices `[i]`."""
    out = base
    for p in parts:  # type: ignore[attr-defined]
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out


class ConstraintFailed(NinferError):
    """A constrained generation could not go on: the constraint allows no next token (its
    grammar cannot continue with this vocabulary), or a committed token was refused. The
    request finishes with 'error' carrying this; nothing the constraint forbids is emitted."""
