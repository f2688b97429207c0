"""What the HTTP handlers share: the server's options, its public model id and its engine.

One `ServerState` is built at startup (after the engine is ready) and handed to
`ninfer.api.server.app.create_app`. It holds no per-request data. Protocol handler modules read what
they need from it (`engine`, `tokenizer`, `template` are set by `ninfer serve`; tests of the
HTTP shell leave them None).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ninfer.api.server.config import ServeConfig


@dataclass
class ServerState:
    """Shared server state.

    config: the frozen serve options. model_id: the public model id (--model-id, else the
    artifact's metadata.name or architecture). created: unix seconds reported by /v1/models.
    engine: the running `ninfer.runtime.engine.Engine` (or None in shell-only tests).
    failure: set to a short reason when the server learns of an engine-wide failure; /health
    then answers 503 for good. `extra` holds protocol-specific objects (tokenizer, template,
    ...) that the integrating code chooses to share.
    """

    config: ServeConfig
    model_id: str
    created: int = field(default_factory=lambda: int(time.time()))
    engine: Any = None
    tokenizer: Any = None
    template: Any = None
    failure: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def max_model_len(self) -> int:
        """The effective per-sequence context ceiling: --max-context, or the KV pool when
        --kv-capacity makes it smaller (the service's, once the engine runs)."""
        service = self.extra.get("service")
        return self.config.engine.max_context if service is None else service.max_context

    def screen(self, fn: Any) -> Any:
        """The `screen` for `decode_body` of the protocol whose request `fn` builds
        (ninfer.api.service.body_screen), or None before the model service runs (and for a
        service of the HTTP shell's tests, which screens nothing)."""
        screen = getattr(self.extra.get("service"), "screen", None)
        return screen(fn) if screen is not None else None

    def healthy(self) -> bool:
        """True while the engine can accept work. Queue saturation does not count as failure;
        an engine whose worker died (its snapshot reports not ready) does."""
        if self.failure is not None:
            return False
        if self.engine is None:
            return True
        snapshot = getattr(self.engine, "snapshot", None)
        return bool(snapshot().ready) if snapshot is not None else True
