"""`ninfer serve MODEL --spec mtp --lm-head-draft` end to end with the official openai client:
the trained tiny head drafts (draft_n / draft_n_accepted in the timings, /metrics counts the
rounds), the reply is the plain one token for token, and an artifact without the component
stops startup with one line naming it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.e2e.conftest import TINY_AGENT, start_server
from tests.spec.spec_serve import chat_is_the_plain_reply_with_draft_work

PROMPT = "What is the capital of France?"


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_agent_mtp):
    tmp = tmp_path_factory.mktemp("mtp")
    s = start_server(
        tmp, "--max-concurrency", "2", "--max-context", "1024", "--spec", "mtp",
        "--lm-head-draft", "--draft-tokens", "3", artifact=tiny_agent_mtp,
    )  # fmt: skip
    yield s
    s.stop()


def test_mtp_chat_reports_draft_work(server, tiny_agent_mtp):
    chat_is_the_plain_reply_with_draft_work(server, tiny_agent_mtp, PROMPT, 60, 3)


def test_an_artifact_without_the_head_stops_startup_with_one_line():
    proc = subprocess.run(
        [sys.executable, "-m", "ninfer.cli", "serve", str(TINY_AGENT), "--port", "0",
         "--max-context", "1024", "--spec", "mtp"],
        check=False, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "--spec mtp needs the artifact's mtp component" in lines[0]
