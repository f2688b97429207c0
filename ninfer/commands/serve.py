"""`ninfer serve [ARTIFACT] [options]`: serve one artifact over OpenAI and Anthropic HTTP.

Startup, in order: parse and validate every option into a frozen `ServeConfig` (one-line
errors naming the flag), open the artifact (the embedded demo model when none is given) and
refuse options needing components it lacks (a --max-context beyond its trained context is
logged as a warning), check the files named by options, build the engine (plan compiled, a KV
pool smaller than --max-context logged as a warning, warm-up run), then listen. `/health`
answers only once the engine is ready: the port is bound before the engine is built (a busy
port fails at once) but listens only after warm-up.

Options and defaults: docs/serving.md, "Server options".
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from ninfer.api.server.config import (
    DRAFT_TOKEN_RANGE,
    LOG_LEVELS,
    SPEC_BACKENDS,
    ServeConfig,
    check_capabilities,
    model_context_warning,
)
from ninfer.errors import ConfigError
from ninfer.ir.kv_formats import KV_DTYPES
from ninfer.passes.options import CPU_WEIGHTS, CompileOptions, default_cpu_weights
from ninfer.runtime.config import EngineOptions

TCP_USER_TIMEOUT_MS = 15000  # a dead or unacknowledging peer is dropped after ~15 s
TCP_KEEPALIVE_IDLE_S = 5
TCP_KEEPALIVE_INTERVAL_S = 5
TCP_KEEPALIVE_COUNT = 3

_CONFIG_FIELDS = frozenset(ServeConfig.__dataclass_fields__) - {"engine"}


def _kv_capacity(text: str) -> int | str:
    if text == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a token count or auto, got {text!r}") from None


class _HelpFormatter(argparse.HelpFormatter):
    """Appends "(default: X)" to options whose default is a value (not unset or a switch)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            action.option_strings
            and "default" not in text
            and default is not None
            and not isinstance(default, bool)
            and default != argparse.SUPPRESS
        ):
            text += " (default: %(default)s)"
        return text


# fmt: off
def add_arguments(p: argparse.ArgumentParser) -> None:
    """Every option of docs/serving.md, "Server options"."""
    p.formatter_class = _HelpFormatter
    p.add_argument("artifact", nargs="?", metavar="ARTIFACT",
                   help=".ninfer file to serve, or a .gguf file or Hugging Face model directory (converted "
                        "once into $NINFER_CACHE); omitted: the embedded SmolLM2-135M-Instruct demo model")

    g = p.add_argument_group("network and access")
    g.add_argument("--host", default="127.0.0.1", metavar="H", help="listen address")
    g.add_argument("--port", type=int, default=8080, metavar="N", help="listen port")
    g.add_argument("--api-key", metavar="KEY",
                   help="require this bearer token or x-api-key value (unset: no authentication)")
    g.add_argument("--model-id", metavar="ID",
                   help="public OpenAI model alias (default: the artifact's metadata.name, else its architecture)")
    g.add_argument("--cors", action="store_true", help="add permissive browser CORS headers")
    g.add_argument("--max-request-mib", type=int, default=384, metavar="N",
                   help="request body limit before JSON parsing (413 above it)")
    g.add_argument("--client-timeout-s", type=float, default=30.0, metavar="S",
                   help="close a connection idle or sending request headers for S seconds; "
                        "a request body not complete S seconds after its headers gets 408")

    g = p.add_argument_group("engine")
    g.add_argument("--device", metavar="N",
                   help="CUDA device index N, cuda[:N] or cpu (default: CUDA device 0 when available, else cpu)")
    g.add_argument("--dtype", choices=("float32", "bfloat16"),
                   help="activation dtype (default: bfloat16 on cuda, float32 on cpu)")
    g.add_argument("--max-context", type=int, default=8192, metavar="N",
                   help="logical context ceiling of each sequence, in tokens")
    g.add_argument("--kv-capacity", type=_kv_capacity, metavar="N|auto",
                   help="shared KV pool in tokens, or auto to fill the remaining device memory (default: --max-context)")
    g.add_argument("--max-concurrency", type=int, default=1, metavar="N", help="resident execution lanes, 1..8")
    g.add_argument("--max-pending-requests", type=int, default=16, metavar="N",
                   help="additional requests allowed to wait for admission (more: 429)")
    g.add_argument("--pending-timeout-ms", type=int, default=30000, metavar="N",
                   help="maximum preparation-plus-admission wait (longer: 503)")
    g.add_argument("--prefill-chunk", type=int, default=1024, metavar="N", help="text-prefill chunk, in tokens")
    g.add_argument("--kv-dtype", choices=KV_DTYPES,
                   help="KV-cache storage (default: bf16 on cuda, the compute dtype on cpu)")
    g.add_argument("--no-cuda-graph", dest="cuda_graph", action="store_false", help="disable CUDA Graph decode")
    g.add_argument("--cpu-weights", choices=CPU_WEIGHTS,
                   help="on cpu, keep GGUF weights packed for the cpu.* kernels or expand them to float32"
                        " (default: float32 when --dtype float32 is given, else packed)")
    g.add_argument("--no-prefix-reuse", dest="prefix_reuse", action="store_false",
                   help="disable compatible-prefix caching")
    g.add_argument("--tensor-parallel", type=int, default=1, metavar="N",
                   help="shard the model over N ranks (N GPUs on cuda, N processes on cpu); a power of "
                        "two dividing the attention and KV heads")
    g.add_argument("--device-state-slots", type=int, metavar="N",
                   help="extra device state images beyond --max-concurrency (default: --max-concurrency)")
    g.add_argument("--host-context-mib", type=int, metavar="N",
                   help="shared pinned host budget for state images, KV and pause snapshots "
                        "(default: 8192 MiB + 8 state images)")
    g.add_argument("--context-cost-presets", metavar="FILE",
                   help="runtime context-cost preset registry (JSON; default: generic + compiled defaults)")

    ranges = ", ".join(f"{k} {lo}..{hi}" for k, (lo, hi) in DRAFT_TOKEN_RANGE.items())
    g = p.add_argument_group("speculative decoding and vision")
    g.add_argument("--spec", choices=SPEC_BACKENDS,
                   help="speculative backend: mtp|dflash|dflash2 need that component in the artifact, "
                        "draft runs --draft-model (default: off)")
    g.add_argument("--draft-model", metavar="ARTIFACT",
                   help="--spec draft: a small model with the same tokenizer (.ninfer, .gguf or HF directory)")
    g.add_argument("--draft-tokens", type=int, metavar="N", help=f"draft tokens per round ({ranges}); requires --spec")
    g.add_argument("--lm-head-draft", action="store_true", help="load the optimized proposal head; requires --spec")
    g.add_argument("--vision", action="store_true", help="enable image/video input; needs the artifact's vision component")
    g.add_argument("--media-cache-mib", type=int, default=1024, metavar="N",
                   help="LRU-retained prepared media payloads; 0 disables retention")
    g.add_argument("--media-live-mib", type=int, default=2048, metavar="N", help="all live prepared media payloads")
    g.add_argument("--media-preprocess-threads", type=int, default=0, metavar="N",
                   help="media preprocessing workers; 0 selects at most 16 from host concurrency")
    g.add_argument("--media-allow-private", action="store_true",
                   help="let media URLs reach loopback, private and link-local addresses (local use; "
                        "metadata addresses stay refused)")

    g = p.add_argument_group("generation defaults")
    g.add_argument("--chat-template", metavar="FILE", help="Jinja chat template to use instead of the artifact's")
    g.add_argument("--default-max-tokens", type=int, default=8192, metavar="N",
                   help="output limit when a request gives none")
    g.add_argument("--default-thinking-budget", type=int, metavar="N",
                   help="positive thinking-token cap for thinking-enabled requests (default: unset)")
    g.add_argument("--no-thinking", dest="thinking", action="store_false",
                   help="disable thinking by default (requests may enable it)")
    g.add_argument("--preserve-thinking", action="store_true",
                   help="preserve closed-turn assistant reasoning by default")
    g.add_argument("--temperature", type=float, metavar="F", help="process-level temperature override (default: unset)")
    g.add_argument("--top-p", type=float, metavar="F", help="process-level top-p override (default: unset)")
    g.add_argument("--top-k", type=int, metavar="N",
                   help="process-level top-k override, 0..20; 0 selects the top-20 cap (default: unset)")
    g.add_argument("--min-p", type=float, metavar="F", help="process-level min-p override (default: unset)")
    g.add_argument("--presence-penalty", type=float, metavar="F",
                   help="process-level presence-penalty override (default: unset)")
    g.add_argument("--frequency-penalty", type=float, metavar="F",
                   help="process-level frequency-penalty override (default: unset)")
    g.add_argument("--seed", type=int, metavar="N",
                   help="fixed seed when a request omits one (default: a fresh random seed per request)")
    g.add_argument("--greedy", action="store_true", help="force exact argmax for all requests")

    g = p.add_argument_group("logging and storage")
    g.add_argument("--log-level", choices=LOG_LEVELS, default="info", help="stderr verbosity")
    g.add_argument("--log-stats-interval-ms", type=int, default=5000, metavar="N",
                   help="aggregate throughput report interval; 0 disables it")
    g.add_argument("--request-log-jsonl", metavar="FILE",
                   help="append full-precision server/request records to FILE (default: disabled)")
    g.add_argument("--response-store-max-records", type=int, default=1024, metavar="N",
                   help="maximum locally retained Responses objects")
    g.add_argument("--response-store-max-mib", type=int, default=256, metavar="N",
                   help="total local Responses storage budget")
    g.add_argument("--reasoning-key-file", metavar="FILE",
                   help="key (>= 32 bytes) of Responses reasoning tokens (encrypted_content); "
                        "default: env NINFER_REASONING_KEY_FILE, else random per process")
# fmt: on


def resolve_device(device: str | None, cuda_available: bool) -> str:
    """--device as "cpu" or "cuda:N". None: cuda:0 when CUDA is available, else cpu."""
    if device is None:
        return "cuda:0" if cuda_available else "cpu"
    d = device.strip().lower()
    if d.isdigit():
        d = f"cuda:{int(d)}"
    elif d == "cuda":
        d = "cuda:0"
    if not re.fullmatch(r"cpu|cuda:\d+", d):
        raise ConfigError(f"--device must be cpu, cuda, cuda:N or a CUDA index N, got {device!r}")
    if d.startswith("cuda") and not cuda_available:
        raise ConfigError(
            f"--device {device}: CUDA is not available on this machine; use --device cpu"
        )
    return d


def config_from_args(
    args: argparse.Namespace, *, cuda_available: bool | None = None
) -> ServeConfig:
    """The validated ServeConfig of parsed arguments. `cuda_available` None asks torch."""
    if cuda_available is None:
        cuda_available = _cuda_available()
    device = resolve_device(args.device, cuda_available)
    engine = EngineOptions(
        compile=CompileOptions(
            device="cpu" if device == "cpu" else "cuda",
            dtype=args.dtype or ("float32" if device == "cpu" else "bfloat16"),
            kv_dtype=args.kv_dtype,
            max_concurrency=args.max_concurrency,
            max_context=args.max_context,
            kv_capacity=args.kv_capacity,
            prefill_chunk=args.prefill_chunk,
            device_state_slots=args.device_state_slots,
            cuda_graphs=args.cuda_graph,
            cpu_weights=args.cpu_weights or default_cpu_weights(args.dtype),
            vision=args.vision,
            tensor_parallel=args.tensor_parallel,
        ),
        device_index=None if device == "cpu" else int(device.removeprefix("cuda:")),
        max_pending_requests=args.max_pending_requests,
        pending_timeout_ms=args.pending_timeout_ms,
        prefix_reuse=args.prefix_reuse,
        default_max_tokens=args.default_max_tokens,
        host_context_mib=args.host_context_mib,
        **(
            {
                "spec": "draft",
                "draft_model": args.draft_model,
                "draft_tokens": args.draft_tokens or 4,
            }
            if args.spec == "draft" and args.draft_model is not None
            else {}
        ),
        **(  # the artifact's MTP head (its mtp component: checked before the engine starts)
            {
                "spec": "mtp",
                "draft_tokens": args.draft_tokens or 3,
                "lm_head_draft": args.lm_head_draft,
            }
            if args.spec == "mtp"
            else {}
        ),
        **(  # the artifact's DFlash drafter (its dflash component: checked at startup); by
            # default a round takes the drafter's whole block (at most block_size - 1 drafts)
            {
                "spec": "dflash",
                "draft_tokens": args.draft_tokens or 15,
                "lm_head_draft": args.lm_head_draft,
            }
            if args.spec == "dflash"
            else {}
        ),
    )
    values = {k: v for k, v in vars(args).items() if k in _CONFIG_FIELDS}
    return ServeConfig(**values, engine=engine)


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return False
    return bool(torch.cuda.is_available())


def check_files(config: ServeConfig, artifact_path: Path) -> None:
    """Options naming files: readable chat template, an existing --draft-model, parseable
    context-cost presets, and a
    request log whose directory exists and that is not the artifact. Raises ConfigError."""
    if config.chat_template is not None:
        path = Path(config.chat_template)
        if not path.is_file():
            raise ConfigError(f"--chat-template {path}: no such file")
    from ninfer.api.responses.reasoning_seal import KEY_ENV, configured_key

    if config.reasoning_key_file is not None or os.environ.get(KEY_ENV):
        configured_key(config.reasoning_key_file)  # unreadable or short: abort before the model
    if config.draft_model is not None and not Path(config.draft_model).exists():
        raise ConfigError(f"--draft-model {config.draft_model}: no such file or directory")
    if config.context_cost_presets is not None:
        from ninfer.api.observability.context_cost import load_presets

        load_presets(config.context_cost_presets)  # malformed: abort before loading the model
    if config.request_log_jsonl is not None:
        path = Path(config.request_log_jsonl)
        if not path.parent.resolve().is_dir():
            raise ConfigError(
                f"--request-log-jsonl {path}: the directory {path.parent} does not exist"
            )
        if path.resolve() == artifact_path.resolve():
            raise ConfigError(
                f"--request-log-jsonl {path}: refuses to write over the model artifact"
            )


def bound_socket(host: str, port: int) -> socket.socket:
    """A bound TCP socket (`listen` makes it accept) whose accepted connections inherit TCP
    keepalive and a 15 s TCP_USER_TIMEOUT (Linux), so a dead peer is detected while its request
    runs. Bound before the engine is built, so a busy port is reported at once, not after
    warm-up; until it listens, connections to it are refused."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (
        ("TCP_KEEPIDLE", TCP_KEEPALIVE_IDLE_S),
        ("TCP_KEEPINTVL", TCP_KEEPALIVE_INTERVAL_S),
        ("TCP_KEEPCNT", TCP_KEEPALIVE_COUNT),
        ("TCP_USER_TIMEOUT", TCP_USER_TIMEOUT_MS),
    ):
        if hasattr(socket, name):  # Linux; elsewhere the defaults stay
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ConfigError(
            f"cannot listen on {host}:{port} ({e.strerror}); choose another --host/--port"
        ) from None
    return sock


def listen(sock: socket.socket) -> None:
    sock.listen(2048)


def configure_logging(level: str) -> None:
    """Operational records on stderr, `YYYY-MM-DD HH:MM:SS.mmm LEVEL message`, for ninfer's
    loggers and uvicorn's (whose own logging configuration is not installed); control
    characters escaped, so redirected stderr holds no terminal control sequences."""
    from ninfer.api.observability.oplog import configure_stderr

    configure_stderr(level, sys.stderr)


def open_artifact(config: ServeConfig) -> Any:
    """The artifact to serve (the demo model when none was given), with the capability
    options checked against its components (and a warning logged for a --max-context beyond its
    trained context)."""
    from ninfer.artifact import Artifact
    from ninfer.artifact.cache import servable_path
    from ninfer.ir.models import check_tensors

    # an artifact as it is; a .gguf / model directory / None (the demo) converted once, cached
    artifact = Artifact(servable_path(config.artifact, check_model=check_tensors))
    check_capabilities(config, artifact.components)
    if warning := model_context_warning(config, artifact.config):
        logging.getLogger("ninfer.serve").warning(warning)
    if config.spec not in (
        None,
        "draft",
        "mtp",
        "dflash",
    ):  # lossless either way: the same tokens, one per step
        logging.getLogger("ninfer.serve").warning(
            "--spec %s: this build of ninfer has no speculative decoding runtime; requests decode "
            "one token per step and the speculative counters stay 0",
            config.spec,
        )
    return artifact


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    configure_logging(config.log_level)
    log = logging.getLogger("ninfer.serve")
    artifact = open_artifact(config)
    check_files(config, artifact.path)
    # Observability: the request log opens before the engine starts (a bad path fails fast).
    from ninfer.api.observability import metrics
    from ninfer.api.observability.request_log import RequestLog
    from ninfer.api.observability.wiring import Observability

    request_log = None
    if config.request_log_jsonl is not None:
        request_log = RequestLog.open(config.request_log_jsonl, artifact.path)
    sock = bound_socket(config.host, config.port)
    try:
        state = build_state(config, artifact)
    except BaseException:
        sock.close()
        raise
    observability = Observability.start(state, artifact, request_log=request_log)
    from ninfer.api.server.app import create_app

    app = create_app(state, extra_handlers=metrics.route_handlers(state))
    listen(sock)
    host = f"[{config.host}]" if ":" in config.host else config.host  # an IPv6 literal
    url = f"http://{host}:{sock.getsockname()[1]}"
    log.info("serving %s as %r on %s", artifact.path, state.model_id, url)
    app.on_startup.append(lambda: observability.ready(url))
    signal.signal(signal.SIGTERM, _terminated)
    try:
        serve_forever(app, sock, config)
    finally:
        engine = state.engine
        if engine is not None and hasattr(engine, "close"):
            engine.close()
        if (media := state.extra.get("media")) is not None:
            media.close()  # the preprocessing workers
        service = state.extra.get("service")
        if service is not None and service.body_screen is not None:
            service.body_screen.close()  # the body-screening worker process
        observability.close()
        log.info("shutdown complete")
    return 0


def _terminated(signum: int, frame: Any) -> None:
    """SIGTERM (uvicorn re-raises it after its graceful stop): unwind through `run`'s cleanup,
    so the engine closes and the shutdown record is written, instead of dying silently."""
    raise SystemExit(128 + signum)


def build_state(config: ServeConfig, artifact: Any) -> Any:
    """Start the engine on `artifact` (plan compiled, warm-up run) and return the ServerState.

    INTEGRATION POINT (lead): build the executor/engine, tokenizer and chat template here —
    `--chat-template` overrides `artifact.chat_template` — and put them on the state.
    """
    from ninfer.api.server.state import ServerState

    state = ServerState(config=config, model_id=config.public_model_id(artifact.name))
    engine_factory = _engine_factory()
    if engine_factory is None:
        logging.getLogger("ninfer.serve").warning(
            "no engine is integrated yet: serving the HTTP shell only"
        )
    else:
        engine_factory(state, artifact)
    return state


def _engine_factory() -> Any:
    """`ninfer.api.server.engine.start_engine(state, artifact)` when the lead has provided it."""
    import importlib

    try:
        server_engine = importlib.import_module("ninfer.api.server.engine")
    except ModuleNotFoundError as e:
        if e.name == "ninfer.api.server.engine":
            return None
        raise
    return server_engine.start_engine


def serve_forever(app: Any, sock: socket.socket, config: ServeConfig) -> None:
    """Run uvicorn on the already-bound socket until interrupted."""
    uv_level = (
        "critical"
        if config.log_level == "off"
        else ("debug" if config.log_level == "trace" else config.log_level)
    )
    from ninfer.api.server.http_server import graceful_server, uvicorn_config

    service = app.state.server.extra.get("service")
    server = graceful_server(
        uvicorn_config(
            app,
            client_timeout_s=config.client_timeout_s,
            log_level=uv_level,
            timeout_graceful_shutdown=5,
            lifespan="on",
        ),
        on_grace_end=service.stop_all if service is not None else None,
    )
    server.run(sockets=[sock])
