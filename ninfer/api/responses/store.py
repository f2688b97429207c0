"""The local Response store: a bounded LRU of terminal Responses and their conversation state.

Stored Responses live only in this process (docs/serving.md, "Stored
Responses"). A `StoredResponse` holds:

    response      the terminal wire object (what GET /v1/responses/{id} returns)
    input_items   the canonical input Items supplied to that request (GET .../input_items)
    context       every Item of the chain up to and including this Response's output, in order:
                  ancestors' input and output Items, this input, this output. A child built on
                  `previous_response_id` replays it; the tuple shares the ancestors' Item dicts
                  (no copies), so deleting or evicting an ancestor never breaks a descendant.
    preserve_thinking  the resolved value, inherited by children that omit it
    session_key   the engine session key of the chain (None for anonymous store:false roots)

Bounds: `max_records` Responses and `max_bytes` of accounted size, where a record's size is its
envelope (the response without output) plus its whole context as JSON — a conservative count,
since contexts share Items. Inserting evicts least-recently-used records until both bounds hold;
a record that alone exceeds a bound fails with `response_store_capacity_exceeded` (nothing is
stored). `get` marks a record recently used. Single-threaded (the HTTP event loop) use only.

A store:true Response is *running* from its create until it ends (`begin` / `end`): it is not
retrievable yet (404 saying so, as GET retrieves terminal objects only), and a DELETE then
succeeds and means it is never stored: `end` tells the create whether to store its result.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ninfer.api.wire import errors
from ninfer.api.wire.errors import ApiError

MIB = 1024 * 1024


def response_not_found(response_id: str, param: str | None = None) -> ApiError:
    return ApiError(
        404,
        f"no stored response with id {response_id!r} (responses sent with store:false, deleted, "
        "evicted or from before a restart are not retained)",
        code="response_not_found",
        param=param,
    )


def capacity_exceeded(size: int, limit: int, records: int = 1) -> ApiError:
    if records < 1:
        why = "this server stores no responses (--response-store-max-records 0)"
    else:
        why = (
            f"the response and its conversation need {size} bytes, more than this server's "
            f"response store holds ({limit} bytes, --response-store-max-mib)"
        )
    return ApiError(
        400,
        f"{why}; send store:false or raise the limit",
        code="response_store_capacity_exceeded",
        param="store",
    )


def json_size(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False).encode())


@dataclass(frozen=True)
class StoredResponse:
    """One retained Response (see module docstring). `context_bytes` is the JSON size of
    `context`; `size` the accounted size of the record."""

    id: str
    response: dict[str, Any]
    input_items: tuple[dict[str, Any], ...]
    context: tuple[dict[str, Any], ...]
    context_bytes: int
    preserve_thinking: bool | None
    session_key: str | None
    size: int


def make_record(
    response: dict[str, Any],
    input_items: Sequence[dict[str, Any]],
    parent: StoredResponse | None,
    *,
    preserve_thinking: bool | None,
    session_key: str | None,
    parent_context: Sequence[dict[str, Any]] | None = None,
) -> StoredResponse:
    """The record of a terminal `response` whose new input was `input_items`, continuing
    `parent` (its context is replayed first)."""
    output = tuple(response.get("output", ()))
    base = parent.context if parent is not None else tuple(parent_context or ())
    base_bytes = parent.context_bytes if parent is not None else sum(json_size(i) for i in base)
    own = tuple(input_items) + output
    context_bytes = base_bytes + sum(json_size(i) for i in own)
    envelope = json_size({**response, "output": []})
    return StoredResponse(
        id=response["id"],
        response=response,
        input_items=tuple(input_items),
        context=base + own,
        context_bytes=context_bytes,
        preserve_thinking=preserve_thinking,
        session_key=session_key,
        size=envelope + context_bytes,
    )


class ResponseStore:
    """Bounded LRU of `StoredResponse`s (see module docstring)."""

    def __init__(self, max_records: int, max_bytes: int) -> None:
        self.max_records = max_records
        self.max_bytes = max_bytes
        self._records: OrderedDict[str, StoredResponse] = OrderedDict()
        self._bytes = 0
        self._running: set[str] = set()

    @classmethod
    def from_config(cls, config: Any) -> ResponseStore:
        """From ServeConfig's --response-store-max-records / --response-store-max-mib."""
        return cls(config.response_store_max_records, config.response_store_max_mib * MIB)

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, response_id: str) -> bool:
        return response_id in self._records

    @property
    def bytes_used(self) -> int:
        return self._bytes

    def check_fits(self, size: int) -> None:
        """Raise `response_store_capacity_exceeded` if a record of `size` bytes can never be
        stored (also when the store holds no records at all)."""
        if self.max_records < 1 or size > self.max_bytes:
            raise capacity_exceeded(size, self.max_bytes, self.max_records)

    def get(self, response_id: str) -> StoredResponse | None:
        """The record, marked most recently used; None when absent."""
        rec = self._records.get(response_id)
        if rec is not None:
            self._records.move_to_end(response_id)
        return rec

    def require(self, response_id: str, param: str | None = None) -> StoredResponse:
        rec = self.get(response_id)
        if rec is None and response_id in self._running:
            raise ApiError(
                404,
                f"response {response_id!r} is still in progress: only a finished response can be "
                "retrieved or continued",
                code="response_not_found",
                param=param,
            )
        if rec is None:
            raise response_not_found(response_id, param)
        return rec

    def begin(self, response_id: str) -> None:
        """A store:true Response starts generating (see the module docstring)."""
        self._running.add(response_id)

    def end(self, response_id: str) -> bool:
        """It stopped generating: True when it may be stored (no DELETE came meanwhile)."""
        if response_id not in self._running:
            return False
        self._running.discard(response_id)
        return True

    def put(self, record: StoredResponse) -> list[str]:
        """Store `record` (replacing one with the same id), evicting least-recently-used records
        until both bounds hold. Returns the evicted ids. Raises capacity_exceeded, storing
        nothing, when the record alone does not fit."""
        self.check_fits(record.size)
        self.delete(record.id)
        evicted: list[str] = []
        while self._records and (
            len(self._records) + 1 > self.max_records or self._bytes + record.size > self.max_bytes
        ):
            old_id, old = self._records.popitem(last=False)
            self._bytes -= old.size
            evicted.append(old_id)
        self._records[record.id] = record
        self._bytes += record.size
        return evicted

    def delete(self, response_id: str) -> bool:
        """Remove a record, or keep a running Response from being stored; False when neither."""
        if response_id in self._running:
            self._running.discard(response_id)
            return True
        rec = self._records.pop(response_id, None)
        if rec is None:
            return False
        self._bytes -= rec.size
        return True


STORE_KEY = "responses_store"


def response_store(state: Any) -> ResponseStore:
    """The process's Response store (in `state.extra`), created on first use from the serve
    options."""
    store = state.extra.get(STORE_KEY)
    if store is None:
        store = state.extra[STORE_KEY] = ResponseStore.from_config(state.config)
    return store


def list_page(
    items: list[dict[str, Any]], *, after: str | None, limit: int, order: str
) -> dict[str, Any]:
    """One cursor page of Items: `order` asc (input order) or desc, starting after the Item
    whose id is `after`."""
    seq = items if order == "asc" else items[::-1]
    if after:
        ids = [it["id"] for it in seq]
        if after not in ids:
            raise errors.invalid_value("after", f"no input Item with id {after!r} in this response")
        seq = seq[ids.index(after) + 1 :]
    page = seq[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(seq) > limit,
    }


def query_truthy(value: str | None) -> bool:
    return value is not None and value.lower() in ("true", "1")


def query_int(raw: str | None, name: str, default: int, lo: int, hi: int) -> int:
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise errors.invalid_type(name, "an integer", raw) from None
    if not lo <= value <= hi:
        raise errors.invalid_value(name, f"must be in {lo}..{hi}, got {value}")
    return value
