"""The local Response store: LRU bounds by records and bytes, capacity refusal, deletion, and
chain contexts that survive their ancestors."""

from __future__ import annotations

from typing import Any

import pytest

from ninfer.api.responses.store import MIB, ResponseStore, StoredResponse, json_size, make_record
from ninfer.api.wire.errors import ApiError


def response(rid: str, text: str = "answer") -> dict[str, Any]:
    out = [{"id": "msg_" + rid, "type": "message", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}]  # fmt: skip
    return {"id": rid, "object": "response", "status": "completed", "output": out}


def user(text: str, iid: str) -> dict[str, Any]:
    return {
        "id": iid,
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": text}],
    }


def record(rid: str, parent: StoredResponse | None = None, text: str = "answer") -> StoredResponse:
    return make_record(
        response(rid, text),
        [user("q", "in_" + rid)],
        parent,
        preserve_thinking=None,
        session_key=None,
    )


def test_context_chains_input_and_output_items():
    a = record("a")
    b = record("b", a)
    assert [i["id"] for i in a.context] == ["in_a", "msg_a"]
    assert [i["id"] for i in b.context] == ["in_a", "msg_a", "in_b", "msg_b"]
    assert b.context[0] is a.context[0]  # shared, not copied
    assert b.context_bytes == sum(json_size(i) for i in b.context)
    assert b.size == b.context_bytes + json_size({**b.response, "output": []})
    assert b.input_items == (user("q", "in_b"),)


def test_lru_eviction_by_record_count_prefers_recently_used():
    store = ResponseStore(max_records=2, max_bytes=MIB)
    store.put(record("a"))
    store.put(record("b"))
    assert store.get("a") is not None  # a becomes most recently used
    assert store.put(record("c")) == ["b"]
    assert "a" in store and "c" in store and "b" not in store and len(store) == 2


def test_eviction_by_bytes_and_accounting():
    one = record("a").size
    store = ResponseStore(max_records=100, max_bytes=2 * one + one // 2)
    for rid in "abc":
        store.put(record(rid))
    assert "a" not in store and len(store) == 2
    assert store.bytes_used == record("b").size + record("c").size
    assert store.delete("b") and not store.delete("b")
    assert store.bytes_used == record("c").size


def test_a_record_larger_than_the_store_is_refused_not_stored():
    rec = record("big", text="x" * 5000)
    store = ResponseStore(max_records=10, max_bytes=rec.size - 1)
    store.put(record("a"))
    with pytest.raises(ApiError) as e:
        store.put(rec)
    assert (e.value.status, e.value.code) == (400, "response_store_capacity_exceeded")
    assert "big" not in store and "a" in store  # nothing evicted for a record that cannot fit
    assert "--response-store-max-mib" in e.value.message
    with pytest.raises(ApiError) as e:  # the record count is what bites, and the message says so
        ResponseStore(max_records=0, max_bytes=MIB).put(record("a"))
    assert "stores no responses (--response-store-max-records 0)" in e.value.message


def not_found(store: ResponseStore, rid: str) -> ApiError:
    """The error of continuing from `rid`, which must be a 404 naming the field."""
    with pytest.raises(ApiError) as e:
        store.require(rid, "previous_response_id")
    assert (e.value.status, e.value.code, e.value.param) == (
        404,
        "response_not_found",
        "previous_response_id",
    )
    return e.value


def test_deleting_a_parent_keeps_the_child_context():
    store = ResponseStore(max_records=10, max_bytes=MIB)
    a = record("a")
    store.put(a)
    store.put(record("b", store.require("a")))
    store.delete("a")
    not_found(store, "a")
    c = record("c", store.require("b"))
    assert [i["id"] for i in c.context][:2] == ["in_a", "msg_a"]


def test_from_config_uses_the_serve_flags():
    from ninfer.api.server.config import ServeConfig

    store = ResponseStore.from_config(
        ServeConfig(response_store_max_records=7, response_store_max_mib=3)
    )
    assert (store.max_records, store.max_bytes) == (7, 3 * MIB)


def test_a_running_response_is_not_retrievable_and_a_delete_keeps_it_unstored():
    store = ResponseStore(max_records=10, max_bytes=MIB)
    store.begin("a")
    assert "still in progress" in not_found(store, "a").message
    assert store.end("a") and not store.end("a")  # finished undisturbed: store it (once)
    store.begin("b")
    assert store.delete("b") and not store.delete("b")  # deleted while running
    assert not store.end("b")  # so its result is not stored
    with pytest.raises(ApiError) as e:
        store.require("b")
    assert "still in progress" not in e.value.message
