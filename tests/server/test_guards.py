"""The request guards' decisions, on bodies alone (the served path: tests/server/test_fuzz.py)."""

from __future__ import annotations

import json

import pytest
from kvpool_server.guards import check_body


@pytest.mark.parametrize(
    ("body", "refused"),
    [
        ({"use_beam_search": True, "length_penalty": -1e308}, True),
        ({"use_beam_search": True, "length_penalty": 51}, True),
        ({"use_beam_search": True, "length_penalty": -50}, False),
        ({"use_beam_search": True, "length_penalty": 0.5}, False),
        ({"use_beam_search": False, "length_penalty": -1e308}, False),  # unused without beam search
        ({"length_penalty": 1e308}, False),
        ({"use_beam_search": True, "length_penalty": "x"}, False),  # vLLM's own validation says so
        ({"prompt": "length_penalty"}, False),
    ],
)
def test_a_length_penalty_is_refused_only_where_vllms_beam_search_fails_on_it(
    body: dict[str, object], refused: bool
) -> None:
    problem = check_body(json.dumps(body).encode())
    assert (problem is not None) is refused
    if problem:
        assert problem[0] == "length_penalty"


def test_bodies_that_are_not_json_objects_are_left_to_vllm() -> None:
    assert check_body(b"{length_penalty") is None
    assert check_body(b'["length_penalty"]') is None
    assert check_body(b"NaN") is None
    nan = check_body(b'{"use_beam_search": true, "length_penalty": NaN}')  # Python's json reads NaN
    assert nan is not None
    assert nan[0] == "length_penalty"
    assert "got nan" in nan[1]
