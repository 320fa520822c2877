"""One byte-size grammar for the server's flags and the operator's resource: Kubernetes
quantities (``Mi`` binary, ``M`` decimal). The server's parser and the operator's copy give the
same answer -- or both refuse -- on any input."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kvpool_operator.spec import SpecError, quantity

from kvpool import ConfigError
from kvpool.units import parse_bytes

MiB = 1 << 20


@pytest.mark.parametrize(
    ("text", "size"),
    [("1048576", MiB), ("256Mi", 256 * MiB), ("4Gi", 4 << 30), ("2Ti", 2 << 40), ("64Ki", 64 << 10),
     ("512M", 512 * 10**6), ("3G", 3 * 10**9), ("8K", 8000), (" 7 ", 7)],
)  # fmt: skip
def test_sizes_in_every_accepted_form(text: str, size: int) -> None:
    assert parse_bytes(text) == size


@pytest.mark.parametrize("text", ["", "lots", "-1Mi", "1.5Gi", "12X", "5i", "Mi", "1e9", "256MiB", "256mi"])
def test_anything_else_is_refused_with_the_forms_it_takes(text: str) -> None:
    with pytest.raises(ConfigError, match=r"is not a byte size.*256Mi"):
        parse_bytes(text)


SIZES = st.one_of(
    st.from_regex(r"\A[0-9]{1,6}(Ki|Mi|Gi|Ti|K|M|G|T|k|m|i|B|MiB)?\Z"),
    st.text(alphabet="0123456789KMGTikmB.- ", max_size=8),
)


@given(SIZES)
def test_the_server_and_the_operator_read_every_size_alike(text: str) -> None:
    try:
        ours: int | None = parse_bytes(text)
    except ConfigError:
        ours = None
    try:
        theirs: int | None = quantity(text.strip(), "spec.x")
    except SpecError:
        theirs = None
    assert ours == theirs, text
