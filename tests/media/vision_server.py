"""A real --vision server for the protocol-level media tests, until a vision-tower fixture exists.

`build_vision_text_artifact(root)` makes a tiny random Qwen3 text model whose tokenizer is the
fixture tokenizer plus Qwen's four vision tokens (<|vision_start|>, <|vision_end|>,
<|image_pad|>, <|video_pad|>, ids 512..515, inside the model's 516-id vocabulary, and named by
the config's *_token_id as in Qwen3-VL / Qwen3.5 checkpoints), served with ninfer's built-in
template, which renders image and video items.

`vision_server(artifact, resolver=...)` starts the real engine and service on it with --vision
and the given media options. It calls `start_engine` directly, as `ninfer serve` does after its
startup checks, because the CLI rightly refuses --vision for an artifact without a vision tower:
what runs here is everything of a media request up to the engine (parsing, fetching, decoding,
placing the placeholders, spans on the engine Request); the text model then computes over the
placeholder ids, which is the vision executor's part to replace.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn
from tokenizers import AddedToken, Tokenizer

from artifacts.fixtures import TEMPLATE, generation_config
from artifacts.tokenizer import EOS_TOKEN, PAD_TOKEN, VOCAB_SIZE, build_tokenizer, tokenizer_config
from ninfer.api.app import create_app
from ninfer.api.metrics import route_handlers as metrics_routes
from ninfer.api.observability import Observability
from ninfer.api.request_log import RequestLog
from ninfer.api.server_engine import start_engine
from ninfer.api.state import ServerState
from ninfer.artifact import Artifact
from ninfer.media.fetch import FetchLimits
from tests.api.live_app import serve_config

VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
CONFIG_KEYS = ("vision_start_token_id", "vision_end_token_id", "image_token_id", "video_token_id")


def vision_tokenizer() -> Tokenizer:
    tok = build_tokenizer()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in VISION_TOKENS])
    return tok


def build_vision_text_artifact(root: Path) -> Path:
    """`root/vision-text.ninfer` (built once per root)."""
    import torch
    import transformers as tf

    from ninfer.artifact.convert_hf import convert_hf
    from ninfer.ir.models import check_tensors

    out = root / "vision-text.ninfer"
    if out.exists():
        return out
    tok = vision_tokenizer()
    ids = {k: tok.token_to_id(t) for k, t in zip(CONFIG_KEYS, VISION_TOKENS, strict=True)}
    eos, pad = tok.token_to_id(EOS_TOKEN), tok.token_to_id(PAD_TOKEN)
    cfg = tf.Qwen3Config(
        vocab_size=VOCAB_SIZE + len(VISION_TOKENS), hidden_size=64, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_hidden_layers=2, intermediate_size=128,
        max_position_embeddings=4096, tie_word_embeddings=True, eos_token_id=eos, pad_token_id=pad,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(516)
        model = tf.Qwen3ForCausalLM(cfg).float().eval()
    hf = root / f".vision-text-hf.{os.getpid()}"
    shutil.rmtree(hf, ignore_errors=True)
    model.save_pretrained(hf)
    config = json.loads((hf / "config.json").read_text(encoding="utf-8"))
    (hf / "config.json").write_text(json.dumps({**config, **ids}, indent=2), encoding="utf-8")
    tok.save(str(hf / "tokenizer.json"))
    template = TEMPLATE.read_text(encoding="utf-8")
    (hf / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config(template), indent=2), encoding="utf-8"
    )
    (hf / "generation_config.json").write_text(json.dumps(generation_config(eos, pad)))
    convert_hf(hf, out, name="tiny-vision-text", check_model=check_tensors)
    shutil.rmtree(hf, ignore_errors=True)
    return out


@contextmanager
def vision_server(
    artifact: Path,
    resolver: Any = None,
    limits: FetchLimits | None = None,
    request_log: Path | None = None,
    **options: Any,
) -> Iterator[tuple[str, ServerState]]:
    """(base URL, state) of the real server on `artifact`, listening on 127.0.0.1 in a thread,
    with --vision and `options` (ServeConfig keywords); `resolver` answers media host names
    (never DNS), `limits` replace the fetch limits (small ones keep the size and time tests
    fast). Metrics and the request log (to `request_log`) observe it as in `ninfer serve`."""
    config = serve_config(
        artifact=str(artifact), log_stats_interval_ms=0, vision=True, max_context=4096, **options
    )
    state = ServerState(config=config, model_id="tiny-vision-text")
    start_engine(state, Artifact(artifact), resolver=resolver)
    if limits is not None:
        state.extra["media"].preparer.fetcher.limits = limits
    log = RequestLog.open(str(request_log), artifact) if request_log is not None else None
    observability = Observability.start(state, Artifact(artifact), request_log=log, argv=[])
    app = create_app(state, extra_handlers=metrics_routes(state))
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error", lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}", state
    finally:
        server.should_exit = True
        thread.join(30)
        state.engine.close()
        state.extra["media"].close()
        observability.close()
