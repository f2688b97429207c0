"""What decoding a JSON request body will cost in memory, judged before it is decoded.

Python's JSON decoder turns every value into an object: `{}` (2 bytes on the wire) becomes a
dict of ~100 bytes, so a body of many small containers costs ~25x its size once parsed (a
48 MiB body of `{}` took 1.3 GiB). `check_parse_cost` counts the structural characters of the
raw body (bytes.count: C speed, no decoding) and refuses a body whose estimated cost passes
`MAX_PARSE_FACTOR` times its size, so one request costs at most that multiple of
--max-request-mib.

The estimate is an upper bound of what CPython 3.11's decoder allocates (measured with
tracemalloc over bodies made of one repeated shape, tests/adversarial/test_body_memory.py):

    per '{'  100 B   a dict with its GC header and a small key table, plus its slot
    per '['   80 B   a list and its slot
    per ',' or ':'   36 B   a number (24-32 B) or a member's key-table entry, plus a slot
    per '"'   30 B   half of a short string object (~57 B with its slot)
    per byte  2w B   the text itself, twice (the decoded body and the strings built from it),
                     w bytes a character: 1 for ASCII, 2 once any byte >= 0xC0 is present,
                     4 once a 4-byte UTF-8 sequence is (one emoji widens the whole body)
    plus 64 KiB       the decoder's own bookkeeping

Characters inside strings are counted too, so the estimate only errs high. Bodies up to
`EXEMPT_BYTES` are not judged: their worst case is bounded anyway (~48x of 1 MiB).
"""

from __future__ import annotations

from ninfer.api.wire import errors, long_text

MAX_PARSE_FACTOR = 16  # estimated decoded bytes per body byte beyond which a body is refused
EXEMPT_BYTES = 1 << 20
_FOUR_BYTE_LEADS = tuple(bytes([b]) for b in range(0xF0, 0xF8))  # memchr each: C speed
_BOOKKEEPING = 64 * 1024  # the decoder's own lists and slices, whatever the body
_COSTS = ((b"{", 100), (b"[", 80), (b",", 36), (b":", 36), (b'"', 30))


def parse_cost(raw: bytes | str) -> int:
    """The estimated bytes Python allocates to decode `raw` (see the module docstring)."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    # each pass slice by slice: one pass over a maximal body is one C call of 3 ms (15-30 ms on
    # a loaded machine) that stalls the server's event loop (ninfer.api.wire.long_text)
    slices = [(i, i + long_text.WINDOW) for i in range(0, len(data), long_text.WINDOW)]
    if all(data[i:j].isascii() for i, j in slices):
        width = 1
    else:
        width = 4 if any(long_text.find(data, lead) >= 0 for lead in _FOUR_BYTE_LEADS) else 2
    structure = sum(cost * data.count(ch, i, j) for ch, cost in _COSTS for i, j in slices)
    return 2 * width * len(data) + structure + _BOOKKEEPING


def check_parse_cost(raw: bytes | str) -> None:
    """Raise 400 request_too_complex when `raw` (over EXEMPT_BYTES) would cost more than
    MAX_PARSE_FACTOR times its size to decode."""
    size = len(raw)
    if size <= EXEMPT_BYTES:
        return
    cost = parse_cost(raw)
    if cost > MAX_PARSE_FACTOR * size:
        raise errors.ApiError(
            400,
            f"the request body is too dense to decode: its {size / 2**20:.1f} MiB of JSON would "
            f"take about {cost / 2**20:.0f} MiB as objects, more than {MAX_PARSE_FACTOR}x its "
            "size (this server bounds what one request may cost); send fewer, larger values",
            code="request_too_complex",
        )
