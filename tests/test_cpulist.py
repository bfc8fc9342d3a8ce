"""cpulist parsing as the kernel writes it."""

from __future__ import annotations

import pytest

from exporter.cpulist import CpulistError, format_cpulist, parse_cpulist


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("0-3,8", {0, 1, 2, 3, 8}), ("", set()), ("5", {5}), ("0-6:2", {0, 2, 4, 6}), ("0-1, 4\n", {0, 1, 4})],
)
def test_parse(text: str, cpus: set[int]) -> None:
    assert parse_cpulist(text) == cpus


@pytest.mark.parametrize("bad", ["a", "3-1", "1-", "-1", "0-99999999", "1:0"])
def test_bad_cpulist_raises_its_own_error(bad: str) -> None:
    with pytest.raises(CpulistError):
        parse_cpulist(bad)


def test_round_trip() -> None:
    assert format_cpulist(parse_cpulist("0-15,32-47,63")) == "0-15,32-47,63"
