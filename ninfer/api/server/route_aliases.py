"""OpenAI paths without the `/v1` prefix, as llama.cpp's server offers them (docs/serving.md,
"Endpoints").

`UnversionedAliases` rewrites `/chat/completions`, `/responses...` and `/models...` to their
`/v1` form before routing, so an alias is the same route: same handler, same errors, and the
same authentication, CORS and body limits (those layers sit outside and see the client's path).
Anthropic's `/v1/messages` has no alias.
"""

from __future__ import annotations

from litestar.types import ASGIApp, Receive, Scope, Send

# an alias is the path itself or the path followed by "/..."
ALIASED = ("/chat/completions", "/responses", "/models")


def versioned(path: str) -> str | None:
    """The `/v1` path an unversioned alias stands for, or None when `path` is not one."""
    for prefix in ALIASED:
        if path == prefix or path.startswith(prefix + "/"):
            return "/v1" + path
    return None


class UnversionedAliases:
    """ASGI layer: serves each alias in `ALIASED` as its `/v1` path."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            target = versioned(scope["path"])
            if target is not None:
                scope = dict(scope, path=target, raw_path=target.encode())  # type: ignore[assignment]
        await self.app(scope, receive, send)
