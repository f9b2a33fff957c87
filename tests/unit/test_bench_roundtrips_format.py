"""How ``bench roundtrips`` lays out its figures: today's write (e) is compared with the write
before issue 35 (b) and the others with today's, and its "where the time goes" row counts the
writes its ListOffsets answer confirmed (the rest probed, or read back): pure logic, no
broker."""

from __future__ import annotations

import re

from registry.dev.bench_roundtrips import VARIANTS, Cell, RoundtripFigures, format_roundtrips

_BY_KEY = {v.key: v for v in VARIANTS}


def _cell(key: str, latency: float, steps: dict[str, float], *, probed: int = 0,
          read_back: int = 0, late: int = 0) -> Cell:
    cell = Cell(_BY_KEY[key], 1, partition=0, latencies=[latency] * 10, seconds=0.01,
                late_confirms=late, probed=probed, read_back=read_back)
    for name, ms in steps.items():
        cell.steps[name] = [ms] * 10
    return cell


def _rows(text: str, key: str) -> list[list[str]]:
    return [re.split(r"\s{2,}", line) for line in text.splitlines()
            if line.startswith(f"{key}. ")]


def test_today_is_the_baseline_and_its_confirmations_are_counted() -> None:
    figures = RoundtripFigures(writes=10, sizes=(1,), record_bytes=288, where="a test")
    figures.cells = [
        _cell("b", 4.0, {"produce": 0.05, "commit": 2.0, "confirm": 2.0}, late=3),
        _cell("c", 3.0, {"produce": 0.02, "flush": 0.5, "confirm": 2.5}),
        _cell("e", 1.0, {"produce": 0.02, "flush": 0.4, "confirm": 0.6,
                         "list_offsets": 0.3}, probed=4, read_back=1),
    ]
    text = format_roundtrips(figures)
    b, c, e = _rows(text, "b"), _rows(text, "c"), _rows(text, "e")
    assert b[0][5] == "4.00 x e" and c[0][5] == "3.00 x e" and e[0][5] == "0.25 x b"
    # where the time goes: ..., confirm, ListOffsets, 1st answer confirms, ListOffsets confirms
    assert b[1][-4:] == ["2.00", "-", "7/10", "-"]
    assert c[1][-4:] == ["2.50", "-", "10/10", "-"]
    assert e[1][-4:] == ["0.60", "0.30", "-", "6/10 (1 read back)"]


def test_no_read_back_is_said_when_none_was_needed() -> None:
    figures = RoundtripFigures(writes=10, sizes=(1,), record_bytes=288, where="a test")
    figures.cells = [_cell("e", 1.0, {"flush": 0.4, "confirm": 0.3, "list_offsets": 0.3})]
    assert _rows(format_roundtrips(figures), "e")[1][-1] == "10/10"
