"""EngineOptions: one validated object holding the compile options and the engine's own, and
the one place a request's output limit is resolved."""

from __future__ import annotations

import pytest

from ninfer.errors import ConfigError
from ninfer.passes.options import CompileOptions
from ninfer.runtime.config import EngineOptions


def test_keywords_split_into_compile_and_engine_options():
    o = EngineOptions.of(device="cuda:2", max_concurrency=3, kv_dtype="fp8", prefix_reuse=False)
    assert o.compile == CompileOptions(device="cuda", max_concurrency=3, kv_dtype="fp8")
    assert (o.device, o.device_index, o.prefix_reuse, o.dtype) == ("cuda:2", 2, False, "bfloat16")
    assert EngineOptions.of(device="cuda").device == "cuda:0"
    assert (EngineOptions.of().device, EngineOptions.of().dtype) == ("cpu", "float32")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: EngineOptions.of(max_banana=3), "unknown engine option.*max_banana.*known:"),
        (lambda: EngineOptions.of(device="cuda:x"), "--device cuda:x"),
        (lambda: EngineOptions.of(device="tpu"), "--device tpu"),
        (lambda: EngineOptions(device_index=1), "--device cpu takes no device index"),
        (lambda: EngineOptions.of(cuda_graphs="no"), "cuda_graphs must be true or false"),
        (lambda: EngineOptions.of(overlap=1), "overlap must be true or false"),
        (lambda: EngineOptions.of(default_max_tokens=0), "--default-max-tokens"),
        (lambda: EngineOptions(compile={"max_context": 8}), "compile must be CompileOptions"),
    ],
)
def test_bad_options_are_one_line_errors(make, message):
    with pytest.raises(ConfigError, match=message) as e:
        make()
    assert "\n" not in str(e.value)


def test_the_output_limit():
    o = EngineOptions.of(max_context=100, default_max_tokens=30)
    assert o.output_limit(10, None, pool_tokens=1000) == (30, "max_tokens")  # the default
    assert o.output_limit(10, 50, pool_tokens=1000) == (50, "max_tokens")
    assert o.output_limit(80, None, pool_tokens=1000) == (20, "context")  # max_context
    assert o.output_limit(10, 50, pool_tokens=40) == (30, "context")  # a smaller KV pool
    assert o.output_limit(99, 5, pool_tokens=1000) == (1, "context")  # never below one
