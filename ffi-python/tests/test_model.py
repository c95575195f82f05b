"""Random operation sequences against a dict model of what is stored."""

from __future__ import annotations

import itertools
from typing import Optional

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cxlkv
from cxlkv import Result

KEYS = st.integers(min_value=0, max_value=11)
PAYLOADS = st.binary(min_size=1, max_size=3000)
NAMESPACES = itertools.count(1000)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), KEYS, PAYLOADS),
        st.tuples(st.just("reserve"), KEYS, PAYLOADS),
        st.tuples(st.just("abort"), KEYS, PAYLOADS),
        st.tuples(st.just("get"), KEYS, st.integers(0, 4000)),
        st.tuples(st.just("acquire"), KEYS, st.none()),
        st.tuples(st.just("evict"), KEYS, st.none()),
    ),
    max_size=40,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_random_operations_match_a_dict_model(node: cxlkv.Node, ops: list[tuple[str, int, object]]) -> None:
    ns = next(NAMESPACES)  # a fresh namespace per example keeps examples apart
    model: dict[int, bytes] = {}
    for op, key, arg in ops:
        if op == "put":
            assert isinstance(arg, bytes)
            want = Result.EXISTS if key in model else Result.OK
            assert node.put(ns, [(key, arg)]) == [want]
            model.setdefault(key, arg)
        elif op in ("reserve", "abort"):
            assert isinstance(arg, bytes)
            if key in model:
                try:
                    node.reserve(ns, [key], len(arg))
                    raise AssertionError("reserving a stored key must fail")
                except cxlkv.ExistsError:
                    continue
            r = node.reserve(ns, [key], len(arg))
            view = r[0]
            assert view is not None
            view[:] = arg
            del view
            if op == "reserve":
                assert r.publish() == [Result.OK]
                model[key] = arg
            else:
                r.abort()
        elif op == "get":
            assert isinstance(arg, int)
            buf = bytearray(arg)
            [(res, n)] = node.get(ns, [(key, buf)])
            if key not in model:
                assert res == Result.NOT_FOUND
            elif len(model[key]) > arg:
                assert (res, n) == (Result.TOO_LARGE, len(model[key]))
            else:
                assert (res, bytes(buf[:n])) == (Result.OK, model[key])
        elif op == "acquire":
            with node.acquire(ns, [key]) as p:
                got: Optional[memoryview] = p[0]
                assert (bytes(got) if got is not None else None) == model.get(key)
                del got
        else:
            node.evict(1 << 40)
            model.clear()
        assert node.presence(ns, list(range(12)))[1] == [k in model for k in range(12)]
    node.evict(1 << 40)
