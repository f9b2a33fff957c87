"""A write's delivery reports name each record's offset; they may come in another order than
the records were produced (fault campaign seed 6029: an adopt of three jobs was told its
records sat at each other's offsets, and answered wrong_key for records every reader
accepted). ``_Delivery.in_order`` matches each record to its offset by its own bytes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from registry.log import _Delivery


class _Msg:
    def __init__(self, offset: int, key: bytes, value: bytes) -> None:
        self._o, self._k, self._v = offset, key, value

    def offset(self) -> int:
        return self._o

    def key(self) -> bytes:
        return self._k

    def value(self) -> bytes:
        return self._v

    def timestamp(self) -> tuple[int, int]:
        return (2, 1000 + self._o)  # LogAppendTime


@given(st.integers(1, 12), st.integers(0, 10_000), st.randoms(use_true_random=False))
def test_reports_in_any_order_give_each_record_its_own_offset(n, base, rng) -> None:
    records = [(f"ns/job/j{i}/lock", f"value-{i}".encode()) for i in range(n)]
    reports = [_Msg(base + i, k.encode(), v) for i, (k, v) in enumerate(records)]
    rng.shuffle(reports)
    delivery = _Delivery()
    for m in reports:
        delivery(None, m)
    written = delivery.in_order(records, 0)
    assert written is not None
    assert [(r.offset, r.key, r.value, r.timestamp) for r in written] == [
        (base + i, k.encode(), v, 1000 + base + i) for i, (k, v) in enumerate(records)]


def test_reports_that_do_not_account_for_the_records_say_so() -> None:
    records = [("a", b"1"), ("b", b"2")]
    delivery = _Delivery()
    delivery(None, _Msg(5, b"a", b"1"))
    assert delivery.in_order(records, 0) is None  # one report missing
    delivery(None, _Msg(4, b"b", b"2"))  # the log holds them in another order than sent
    assert delivery.in_order(records, 0) is None
