"""`ninfer serve --spec dflash` end to end: the tiny agent with its trained DFlash drafter
through the real server and the official openai client. The reply is the plain one, the
terminal timings carry draft_n / draft_n_accepted, /metrics counts the rounds; the flag reaches
the engine options (a round takes the whole block by default), and an artifact without the
dflash component stops startup with one line naming it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.e2e.conftest import TINY_AGENT, start_server
from tests.spec.spec_serve import chat_is_the_plain_reply_with_draft_work
from tests.spec.test_spec_options import parse


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from artifacts.train_dflash import attached

    tmp = tmp_path_factory.mktemp("dflash")
    artifact = attached(TINY_AGENT, tmp, log=lambda *_: None)
    s = start_server(
        tmp, "--max-concurrency", "2", "--max-context", "1024", "--spec", "dflash",
        "--draft-tokens", "7", artifact=artifact,
    )  # fmt: skip
    yield s
    s.stop()


def test_dflash_chat_is_the_plain_reply_with_draft_work(server):
    timings, rounds = chat_is_the_plain_reply_with_draft_work(
        server, TINY_AGENT, "Is a tomato a fruit?", 80, 7
    )
    # tokens per round well above one: the trained drafter's blocks are mostly accepted
    assert (timings["draft_n_accepted"] + rounds) / rounds >= 2.0


def test_the_flag_reaches_the_engine_options():
    assert (parse("--spec", "dflash").engine.spec, parse("--spec", "dflash").engine.draft_tokens) == ("dflash", 15)  # fmt: skip
    assert parse("--spec", "dflash", "--draft-tokens", "5").engine.draft_tokens == 5
    assert parse("--spec", "dflash", "--lm-head-draft").engine.lm_head_draft is True
    assert parse("--spec", "dflash").engine.lm_head_draft is False


def test_an_artifact_without_the_component_stops_startup_with_one_line():
    proc = subprocess.run(
        [sys.executable, "-m", "ninfer.cli", "serve", str(TINY_AGENT), "--port", "0",
         "--max-context", "1024", "--spec", "dflash"],
        check=False, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(
        "ninfer serve: error: --spec dflash needs the artifact's dflash component"
    ), lines
