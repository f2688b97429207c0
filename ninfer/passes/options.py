"""CompileOptions: everything the pipeline may decide on, read once, frozen and validated.

Field names follow the `ninfer serve` / `ninfer compile` flags (`--kv-dtype` -> `kv_dtype`).
Invalid values raise ConfigError with a one-line message naming the flag. The runtime's
`EngineOptions` (ninfer/runtime/config.py) holds one of these plus the engine's own options.
"""

from __future__ import annotations

from dataclasses import dataclass

from ninfer.errors import ConfigError
from ninfer.ir.kv_formats import KV_DTYPES
from ninfer.ir.types import COMPUTE_DTYPES

DEVICES = ("cpu", "cuda")
# cpu: GGUF Q4_0/Q4_1/Q8_0 weights kept packed for the int4 kernels of kernels/cpu_quant.py
# (bf16 GEMM numerics), or dequantised to float32 at load (the reference numerics). Not given:
# float32 when the caller asked for float32 compute (dtype="float32"), else packed: a bf16 GEMM
# can reorder two tokens whose float32 logits are within its error, which someone who asked
# for float32 would take for a wrong answer.
CPU_WEIGHTS = ("packed", "float32")
MAX_CONCURRENCY = 8


def default_cpu_weights(dtype: str | None) -> str:
    """--cpu-weights when not given, for the dtype the caller asked for (None: not given)."""
    return "float32" if dtype == "float32" else "packed"


MAX_TENSOR_PARALLEL = 64
GIB = 1 << 30
# Memory the planner may use when the caller does not say (`device_memory`): an H200 for cuda
# (the performance target), a modest host for cpu. Fixed numbers keep `ninfer compile` output
# identical on every machine.
DEFAULT_DEVICE_MEMORY = {"cuda": 139 * GIB, "cpu": 16 * GIB}
HEADROOM = GIB  # `--kv-capacity auto` leaves this much free
MAX_VERIFY_ROWS = 64  # graph buckets past this: a verify step that large runs eagerly
VISION_TOKENS = 32768  # the vision envelope: merged tokens of one prompt's media, at most


@dataclass(frozen=True)
class CompileOptions:
    device: str = "cpu"
    dtype: str | None = None  # float32 | bfloat16 | float16; None: float32 on cpu, bfloat16 on cuda
    kv_dtype: str | None = None  # KV_DTYPES; None: the compute dtype on cpu, bf16 on cuda
    max_concurrency: int = 1  # decode lanes, 1..8
    max_context: int = 8192  # tokens per sequence
    kv_capacity: int | str | None = (
        None  # tokens in the shared KV pool | "auto" | None (= max_context)
    )
    page_size: int = 16  # tokens per KV page
    prefill_chunk: int = 1024  # prefill tokens per step (sizes the workspace)
    device_state_slots: int | None = None  # extra recurrent-state slots; None = max_concurrency
    cuda_graphs: bool = True
    # recurrent-state slots a speculating engine adds (hybrid models): k per lane, so that each
    # lane has k + 1 slots and a verify round's accepted count selects one (no copy back)
    spec_state_slots: int = 0
    # rows of a speculating engine's verify step (every lane's fed token and k drafts, one decode
    # row each): CUDA Graph buckets cover decode steps up to this many rows too (0: none)
    verify_rows: int = 0
    device_memory: int | None = None  # bytes the plan may use; None: DEFAULT_DEVICE_MEMORY
    cpu_weights: str | None = None  # CPU_WEIGHTS; None: by dtype (above); cuda plans ignore it
    vision: bool = False  # run the vision tower (--vision): its weights, ops and MRoPE positions
    tensor_parallel: int = 1  # ranks the model is sharded over (passes/shard.py); a power of 2
    tp_rank: int = 0  # the rank this plan is for, 0..tensor_parallel-1
    # hidden states the plan also outputs per position, for drafters that read them (MTP,
    # DFlash): "final" (after the final norm) and "L{i}" (residual stream after layer i);
    # ir/models/decoder.py add_captures. Both executors keep them as `executor.hidden`.
    capture: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ConfigError(
                f"--device {self.device}: unknown device (choose from {', '.join(DEVICES)})"
            )
        if self.dtype is not None and self.dtype not in COMPUTE_DTYPES:
            raise ConfigError(
                f"dtype {self.dtype!r}: unknown (choose from {', '.join(COMPUTE_DTYPES)})"
            )
        if self.kv_dtype is not None and self.kv_dtype not in KV_DTYPES:
            raise ConfigError(
                f"--kv-dtype {self.kv_dtype}: unknown KV dtype (choose from {', '.join(KV_DTYPES)})"
            )
        if self.cpu_weights is None:  # frozen: resolved once, here
            object.__setattr__(self, "cpu_weights", default_cpu_weights(self.dtype))
        if self.cpu_weights not in CPU_WEIGHTS:
            raise ConfigError(
                f"--cpu-weights {self.cpu_weights}: unknown (choose from {', '.join(CPU_WEIGHTS)})"
            )
        int_range("max_concurrency", self.max_concurrency, 1, MAX_CONCURRENCY)
        int_range("max_context", self.max_context, 2, 1 << 24)
        int_range("page_size", self.page_size, 1, 4096)
        int_range("prefill_chunk", self.prefill_chunk, 1, 1 << 24)
        if self.device_state_slots is not None:
            int_range("device_state_slots", self.device_state_slots, 0, 1024)
        int_range("spec_state_slots", self.spec_state_slots, 0, 1 << 16)
        int_range("verify_rows", self.verify_rows, 0, MAX_VERIFY_ROWS)
        if self.kv_capacity is not None and self.kv_capacity != "auto":
            int_range("kv_capacity", self.kv_capacity, self.page_size, 1 << 48)
        if not isinstance(self.cuda_graphs, bool):
            raise ConfigError(f"cuda_graphs must be true or false, got {self.cuda_graphs!r}")
        if self.device_memory is not None:
            int_range("device_memory", self.device_memory, 1, 1 << 50)
        if not isinstance(self.vision, bool):
            raise ConfigError(f"vision must be true or false, got {self.vision!r}")
        if self.vision and isinstance(self.tensor_parallel, int) and self.tensor_parallel > 1:
            raise ConfigError(
                "--vision with --tensor-parallel: the vision tower is not sharded in this build; "
                "drop one of them"
            )
        int_range("tensor_parallel", self.tensor_parallel, 1, MAX_TENSOR_PARALLEL)
        if self.tensor_parallel & (self.tensor_parallel - 1):
            raise ConfigError(
                f"--tensor-parallel must be a power of two (1, 2, 4, 8, ...), "
                f"got {self.tensor_parallel}"
            )
        int_range("tp_rank", self.tp_rank, 0, self.tensor_parallel - 1)
        if not isinstance(self.capture, tuple) or not all(isinstance(c, str) for c in self.capture):
            raise ConfigError(f"capture must be a tuple of names, got {self.capture!r}")
        if self.capture and self.tensor_parallel > 1:
            raise ConfigError(
                "capture with --tensor-parallel: sharded plans do not capture hidden states"
            )

    @property
    def compute_dtype(self) -> str:
        """IR dtype of activations: f32 | bf16 | f16."""
        if self.dtype is not None:
            return COMPUTE_DTYPES[self.dtype]
        return "f32" if self.device == "cpu" else "bf16"

    @property
    def memory_budget(self) -> int:
        return (
            self.device_memory
            if self.device_memory is not None
            else DEFAULT_DEVICE_MEMORY[self.device]
        )

    @property
    def vision_tokens(self) -> int:
        """Merged vision tokens of the largest item the vision stage encodes (sizes its
        workspace): a prompt's worth, at most the 32,768-token vision envelope."""
        return min(self.max_context, VISION_TOKENS)

    @property
    def state_slots(self) -> int:
        extra = self.max_concurrency if self.device_state_slots is None else self.device_state_slots
        return self.max_concurrency + extra + self.spec_state_slots

    @property
    def chunk_tokens(self) -> int:
        """Prefill tokens per step: the chunk, at most one sequence's whole context."""
        return min(self.prefill_chunk, self.max_context)

    @property
    def step_tokens(self) -> int:
        """Most tokens one step computes: a full prefill chunk plus a decode row per other lane."""
        return self.chunk_tokens + self.max_concurrency - 1


def parse_kv_capacity(text: str | int | None) -> int | str | None:
    """`--kv-capacity` value: an integer, "auto", or None."""
    if text is None or isinstance(text, int) or text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"--kv-capacity {text}: expected a number of tokens or 'auto'") from None


def int_range(name: str, value: object, lo: int, hi: int) -> None:
    """Raise ConfigError naming the flag of option `name` unless `value` is an int in lo..hi."""
    flag = "--" + name.replace("_", "-")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{flag} must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise ConfigError(f"{flag} must be in {lo}..{hi}, got {value}")
