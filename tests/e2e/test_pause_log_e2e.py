"""Pause cycles in the JSONL request log of the real `ninfer serve` process: four concurrent
requests on a KV pool that holds about two of them, so that younger ones are paused and brought
back, by replay (no host budget) or from host snapshots. Each pause cycle is logged as
request_scheduling boundaries in order, then a terminal boundary; request_done agrees."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

CYCLE = ["pause_started", "paused", "restore_started", "restored", "replay_complete",
         "recovery_complete"]  # fmt: skip


def read_log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize("route", ["replay", "snapshot"])
def test_pause_cycles_are_logged_in_order(server_factory, tmp_path, route):
    log = tmp_path / "requests.jsonl"
    host = ["--host-context-mib", "0"] if route == "replay" else ["--host-context-mib", "64"]
    s = server_factory(
        "--max-context", "512", "--kv-capacity", "160", "--max-concurrency", "4",
        "--prefill-chunk", "32", "--log-stats-interval-ms", "0", "--request-log-jsonl", str(log),
        *host,
    )  # fmt: skip
    answers: dict[int, httpx.Response] = {}

    def ask(i: int) -> None:
        body = {"model": "tiny-agent", "temperature": 0, "max_tokens": 48, "ignore_eos": True,
                "messages": [{"role": "user", "content": f"Story {i}: " + "tell me more " * (4 + 3 * i)}]}  # fmt: skip
        answers[i] = httpx.post(s.base_url + "/v1/chat/completions", json=body, timeout=120)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(answers[i].status_code == 200 for i in range(4)), answers
    records = read_log(log)
    done = {r["request_id"]: r for r in records if r["event"] == "request_done"}
    assert len(done) == 4 and all(r["usage"]["completion_tokens"] == 48 for r in done.values())
    sched = [r for r in records if r["event"] == "request_scheduling"]
    paused = {rid for rid, r in done.items() if r["generation"]["scheduling"]["preemptions"]}
    assert paused, "the pool was meant to force pauses"
    assert {r["request_id"] for r in sched} == paused
    routes = []
    for rid in paused:
        mine = [r for r in sched if r["request_id"] == rid]
        assert mine[-1]["boundary"] == "terminal" and mine[-1] is not mine[0]
        # on the engine clock like the others, with the global counters too
        assert mine[-1]["steady_ns"] >= mine[-2]["steady_ns"]
        assert set(mine[-1]["progress"]) == {"global", "request"}
        # the request's decode counter is the global one's kind: outputs but the first
        assert mine[-1]["progress"]["request"]["decode_tokens"] == 48 - 1
        cycles = done[rid]["generation"]["scheduling"]["preemptions"]
        assert mine[-1]["preemption_index"] == cycles
        snapshots = 0
        for k in range(1, cycles + 1):
            cycle = [r for r in mine[:-1] if r["preemption_index"] == k]
            names = [r["boundary"] for r in cycle]
            took = cycle[1]["route"]
            assert cycle[0]["route"] is None and {r["route"] for r in cycle[1:]} == {took}
            routes.append(took)
            snapshots += took == "snapshot"
            # a cycle paused again before its first fresh unit ends early, the last one
            # recovers; replay_complete whenever it had positions to recompute
            tails = ([], CYCLE[4:-1], CYCLE[4:], CYCLE[-1:])
            assert names[:4] == CYCLE[:4] and names[4:] in tails, names
            assert took == "replay" or "replay_complete" not in names or k > 1
            assert k < cycles or names[-1] == "recovery_complete", names
            assert [r["steady_ns"] for r in cycle] == sorted(r["steady_ns"] for r in cycle)
            assert [r["elapsed_ns"] for r in cycle] == sorted(r["elapsed_ns"] for r in cycle)
            assert set(cycle[0]["progress"]) == {"global", "request"}
        units = done[rid]["engine_timing"]["units"]
        assert units["control"] == 2 * snapshots  # a save and a restore per snapshot cycle
        moved = done[rid]["context_transfers"]
        if snapshots:  # its own copies, both ways
            out, back = moved["main_kv.device_to_host"], moved["main_kv.host_to_device"]
            assert out["bytes"] == back["bytes"] > 0 and out["operations"] == snapshots
        else:
            assert moved == {}
    # without a host budget every pause replays; with one, snapshots are taken
    assert (set(routes) == {"replay"}) if route == "replay" else ("snapshot" in routes)
