"""Link arithmetic: every speed string sysfs writes, generations, and capacity against published figures."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter import linkmath


@pytest.mark.parametrize(
    ("text", "gts"),
    [
        ("2.5 GT/s PCIe", 2.5), ("5.0 GT/s PCIe", 5.0), ("8.0 GT/s PCIe", 8.0), ("16.0 GT/s PCIe", 16.0),
        ("32.0 GT/s PCIe", 32.0), ("64.0 GT/s PCIe", 64.0),
        # kernels before 4.19: no suffix, integer rates
        ("2.5 GT/s", 2.5), ("5 GT/s", 5.0), ("8 GT/s", 8.0), ("16 GT/s\n", 16.0),
    ],
)
def test_every_generation_speed_string_parses_with_and_without_suffix(text: str, gts: float) -> None:
    assert linkmath.parse_speed(text) == gts


@pytest.mark.parametrize("text", ["Unknown", "Unknown speed", "Unknown\n", "", "33 MHz PCI", "133 MHz PCI-X 266"])
def test_unknown_or_conventional_pci_speed_is_none_not_a_guess(text: str) -> None:
    assert linkmath.parse_speed(text) is None


@pytest.mark.parametrize("text", ["fast", "16", "GT/s", "12.0 GT/s", "8.0 Gb/s", "-8 GT/s", "8.0 GT/s PCIe junk"])
def test_garbage_speed_is_rejected_with_the_value_quoted(text: str) -> None:
    with pytest.raises(linkmath.LinkParseError, match=r"GT/s|speed"):
        linkmath.parse_speed(text)


@pytest.mark.parametrize(("text", "width"), [("16", 16), ("8\n", 8), ("x4", 4), ("1", 1), ("32", 32)])
def test_link_width_parses(text: str, width: int) -> None:
    assert linkmath.parse_width(text) == width


def test_width_zero_means_link_down_not_zero_lanes() -> None:
    assert linkmath.parse_width("0") is None


@pytest.mark.parametrize("text", ["sixteen", "3", "17", "255", "-1"])
def test_garbage_width_is_rejected(text: str) -> None:
    with pytest.raises(linkmath.LinkParseError):
        linkmath.parse_width(text)


def test_generation_and_rate_round_trip_for_gen1_to_gen6() -> None:
    for gen in range(1, 7):
        assert linkmath.generation(linkmath.gts(gen)) == gen
    assert [linkmath.gts(g) for g in range(1, 7)] == [2.5, 5.0, 8.0, 16.0, 32.0, 64.0]
    with pytest.raises(ValueError, match="generation"):
        linkmath.gts(7)
    with pytest.raises(ValueError, match="GT/s"):
        linkmath.generation(12.0)


def test_line_encoding_is_8b10b_then_128b130b_then_flit() -> None:
    assert linkmath.encoding_efficiency(1) == linkmath.encoding_efficiency(2) == 0.8
    assert linkmath.encoding_efficiency(3) == linkmath.encoding_efficiency(5) == 128 / 130
    assert linkmath.encoding_efficiency(6) == 236 / 256
    # The "marketing" figures: Gen3 x16 15.75 GB/s, Gen4 x16 31.5 GB/s, Gen1 x1 250 MB/s after encoding.
    assert linkmath.encoded_bytes_per_second(3, 16) == pytest.approx(15.754e9, rel=1e-3)
    assert linkmath.encoded_bytes_per_second(4, 16) == pytest.approx(31.508e9, rel=1e-3)
    assert linkmath.encoded_bytes_per_second(1, 1) == pytest.approx(250e6)


def test_gen3_x16_capacity_matches_published_12_to_13_gb_per_s() -> None:
    assert 12.0e9 <= linkmath.capacity_bytes_per_second(3, 16) <= 13.0e9


def test_gen4_x16_capacity_matches_published_25_to_26_gb_per_s() -> None:
    assert 25.0e9 <= linkmath.capacity_bytes_per_second(4, 16) <= 26.0e9


def test_capacity_is_80_to_85_percent_of_the_encoded_rate_for_256_byte_payloads() -> None:
    for gen in (1, 2, 3, 4, 5):
        ratio = linkmath.capacity_bytes_per_second(gen, 16) / linkmath.encoded_bytes_per_second(gen, 16)
        assert 0.80 <= ratio <= 0.85


def test_riser_gen3_x8_carries_a_quarter_of_gen4_x16() -> None:
    degraded = linkmath.capacity_bytes_per_second(3, 8)
    assert degraded == pytest.approx(linkmath.capacity_bytes_per_second(4, 16) / 4)
    assert 6.0e9 < degraded < 6.6e9


def test_smaller_payloads_carry_less() -> None:
    assert linkmath.capacity_bytes_per_second(4, 16, payload_bytes=128) < linkmath.capacity_bytes_per_second(4, 16)


def test_capacity_from_sysfs_values_is_none_when_unknown() -> None:
    assert linkmath.capacity_from_speed(None, 16) is None
    assert linkmath.capacity_from_speed(16.0, None) is None
    assert linkmath.capacity_from_speed(16.0, 16) == linkmath.capacity_bytes_per_second(4, 16)


def test_invalid_width_or_generation_is_an_error_not_a_number() -> None:
    with pytest.raises(ValueError, match="width"):
        linkmath.capacity_bytes_per_second(4, 3)
    with pytest.raises(ValueError, match="generation"):
        linkmath.capacity_bytes_per_second(0, 16)


@given(st.sampled_from(range(1, 7)), st.sampled_from(linkmath.WIDTHS), st.integers(min_value=64, max_value=4096))
def test_capacity_is_below_the_encoded_rate_and_grows_with_width(gen: int, width: int, payload: int) -> None:
    cap = linkmath.capacity_bytes_per_second(gen, width, payload)
    assert 0 < cap < linkmath.encoded_bytes_per_second(gen, width) < linkmath.gts(gen) * 1e9 * width / 8
    if width < 32:
        wider = min(w for w in linkmath.WIDTHS if w > width)
        assert linkmath.capacity_bytes_per_second(gen, wider, payload) > cap
    if gen < 6:
        assert linkmath.capacity_bytes_per_second(gen + 1, width, payload) > cap
