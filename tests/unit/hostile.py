"""Strategies for hostile input: what a careless or malicious producer, file or store
could hand the middleware. Shared by ``tests/unit/test_hostile_*.py``.

``HOSTILE`` is the fixed hypothesis budget (profile ``hostile``, registered in
``tests/unit/conftest.py``): derandomized, no deadline, the same examples on every run.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st

from tests.unit import conftest  # noqa: F401 - registers the ``hostile`` profile

HOSTILE = settings.get_profile("hostile")

#: Numbers that break naive arithmetic: NaN, infinities, huge and tiny, negative zero.
odd_floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([float("nan"), float("inf"), float("-inf"), 1e308, -1e308, 5e-324, -0.0]),
)
huge_ints = st.one_of(st.integers(), st.sampled_from([2**63, -(2**63) - 1]),
                      st.builds(lambda: 10**400))
#: Text with surrogates, control characters, right-to-left marks, and some very long.
odd_text = st.one_of(
    st.text(max_size=40),
    st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x10FFFF), max_size=20),
    st.sampled_from(["", " ", "\x00", "\ud800", "acme\n", "ACME", "acme|x",
                     "\u202eemca", "ｓｃｍｅ", "hi", "lo", "mid", "__proto__", "NaN", "1e400"]),
    st.builds(lambda: "a" * 20_000),  # huge (built, so a failure report stays short)
)


def utf8(text: str) -> bytes:
    """``text`` as bytes; lone surrogates become bytes that are not valid UTF-8."""
    return text.encode("utf-8", "surrogatepass")
odd_bytes = st.one_of(st.binary(max_size=40),
                      st.sampled_from([b"\xff\xfe", b"\x80" * 10, b"\xc3\x28", b"{\xff}"]))


def nested(depth: int, leaf: Any = 1) -> Any:
    """A list nested ``depth`` deep (built without recursion)."""
    value: Any = leaf
    for _ in range(depth):
        value = [value]
    return value


deep = st.sampled_from([50, 900, 3_000]).map(nested)
#: Any JSON value (what a decoder can give back), NaN and infinities included.
json_values = st.recursive(
    st.none() | st.booleans() | huge_ints | odd_floats | odd_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(odd_text, inner, max_size=4),
    max_leaves=12,
)


class Hostile:
    """An object whose every conversion raises (len, float, bool, str, repr, hash, eq)."""

    def _boom(self, *_: Any) -> Any:
        raise RuntimeError("hostile object")

    __len__ = __float__ = __int__ = __index__ = __bool__ = __str__ = __repr__ = _boom
    __hash__ = __eq__ = __lt__ = __iter__ = __getitem__ = _boom  # type: ignore[assignment]


class HostileDict(dict):  # type: ignore[type-arg]
    """A dict whose reads raise."""

    def _boom(self, *_: Any) -> Any:
        raise RuntimeError("hostile dict")

    get = __getitem__ = __iter__ = keys = items = _boom  # type: ignore[assignment]


#: Python values (not only JSON): everything above plus bytes, objects and deep nesting.
py_values = st.one_of(
    json_values, odd_bytes, deep,
    st.builds(Hostile), st.builds(HostileDict), st.just(object()), st.just(Ellipsis),
    st.sets(st.integers(), max_size=3), st.just(bytearray(b"\xff" * 3)),
    st.complex_numbers(), st.just(st),  # a module
)


def deep_json_text(depth: int) -> str:
    """JSON nested ``depth`` deep: Python's decoder raises RecursionError past ~1000."""
    return "[" * depth + "]" * depth


#: JSON-ish text: valid, truncated, deeply nested, not JSON at all.
json_texts = st.one_of(
    json_values.map(lambda v: json.dumps(v)),
    json_values.map(lambda v: json.dumps(v)[: max(0, len(json.dumps(v)) // 2)]),
    st.sampled_from([100, 5_000, 100_000]).map(deep_json_text),
    odd_text,
)
