"""One byte-size grammar for every flag of the library and the server: binary units, with or
without ``i`` / ``iB``; anything else is a ConfigError that shows the forms it takes."""

from __future__ import annotations

import pytest

from kvpool import ConfigError
from kvpool.units import parse_bytes

MiB = 1 << 20


@pytest.mark.parametrize(
    ("text", "size"),
    [("1048576", MiB), ("256M", 256 * MiB), ("256Mi", 256 * MiB), ("256MiB", 256 * MiB), ("256mb", 256 * MiB),
     ("4G", 4 << 30), ("1.5G", 3 << 29), (" 64 K ", 64 << 10), ("2T", 2 << 40), ("512B", 512)],
)  # fmt: skip
def test_sizes_in_every_accepted_form(text: str, size: int) -> None:
    assert parse_bytes(text) == size


@pytest.mark.parametrize("text", ["", "lots", "-1M", "1.5", "12X", "5i", "M", "1e9"])
def test_anything_else_is_refused_with_the_forms_it_takes(text: str) -> None:
    with pytest.raises(ConfigError, match=r"is not a byte size.*256Mi"):
        parse_bytes(text)
