import pytest

from common.units import format_bytes, parse_bytes, short_bytes


@pytest.mark.parametrize("text, expected", [
    ("3000000", 3_000_000),
    ("3_000_000", 3_000_000),
    ("3MB", 3_000_000),           # decimal, as the POET reference counts budgets
    ("3mb", 3_000_000),
    ("3 M", 3_000_000),
    ("1.5MiB", 1_572_864),
    ("512 KiB", 524_288),
    ("2.5kB", 2_500),
    ("0.3MB", 300_000),           # no float error turns this into 299,999
    ("1e6", 1_000_000),
    ("1GiB", 2**30),
    (".5MB", 500_000),
    ("0.3KiB", 307),              # fractional bytes round down: a budget never grows
    (3e6, 3_000_000),
])
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "3XB", "1.2.3", "inf", "nan", "MB"])
def test_parse_bytes_refuses_non_sizes(text):
    with pytest.raises(ValueError, match="is not a size"):
        parse_bytes(text)


@pytest.mark.parametrize("text", ["-1", "-1MB", " -0.5GiB"])
def test_parse_bytes_says_a_negative_size_is_negative(text):
    with pytest.raises(ValueError, match="is negative"):
        parse_bytes(text)


def test_format_bytes_shows_exact_and_readable():
    assert format_bytes(3_000_000) == "3,000,000 B (3.00 MB)"
    assert format_bytes(12) == "12 B"
    assert format_bytes(None) == "unconstrained"
    assert short_bytes(2_437_712) == "2.44 MB"
    assert short_bytes(850_000) == "850 kB"
