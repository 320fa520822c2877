"""The preemption tests' output comparison: it forgives a bfloat16 tie and nothing else."""

from __future__ import annotations

import pytest

from kvpool.vllm.launch.runner import Completion
from tests.kvpool.vllm.outputs import assert_same_greedy_output


def completion(tokens: list[int], tops: list[dict[int, float]]) -> Completion:
    return Completion(tokens, "", 0.0, 0.0, 0, tops)


REF = completion([5, 7, 9], [{5: -0.5, 6: -2.0}, {7: -1.0, 8: -1.125}, {9: -0.2, 3: -3.0}])


def test_identical_tokens_pass() -> None:
    assert_same_greedy_output([REF], [REF])


def test_a_divergence_at_a_tie_passes_and_nothing_after_it_is_compared() -> None:
    ours = completion([5, 8, 1], [{5: -0.5, 6: -2.0}, {8: -1.0, 7: -1.25}, {1: -0.1}])
    assert_same_greedy_output([ours], [REF])


def test_a_divergence_far_from_a_tie_fails() -> None:
    ours = completion([5, 8, 9], [{5: -0.5, 6: -2.0}, {8: -0.2, 7: -1.5}, {9: -0.2}])
    with pytest.raises(AssertionError, match="nats apart"):
        assert_same_greedy_output([ours], [REF])


def test_a_token_outside_the_references_top_candidates_fails() -> None:
    ours = completion([5, 4, 9], [{5: -0.5, 6: -2.0}, {4: -1.0, 7: -1.1}, {9: -0.2}])
    with pytest.raises(AssertionError, match="not among the reference's top"):
        assert_same_greedy_output([ours], [REF])


def test_outputs_of_different_lengths_fail() -> None:
    with pytest.raises(AssertionError, match="lengths differ"):
        assert_same_greedy_output([completion([5, 7], REF.logprobs or [])], [REF])
