"""Comparing greedy outputs across a preemption.

A request preempted and resumed recomputes the KV of the tokens it had generated in a prefill,
where they were first computed one decode step at a time, and decodes in a batch of another size.
Both change bfloat16 rounding. The random tiny model's logits are nearly flat, so now and then two
candidates are within that rounding of each other and greedy picks the other one: an honest run
then diverges late, at a tie. A wrong KV block (a stale page, a tier slot read before its load
landed) does not look like that -- it moves every logit, and the divergence is no tie. So the
check is vLLM's own (``check_logprobs_close`` in its tests), tightened: identical tokens, or at
the first difference both tokens among the other run's top candidates *and* within a few
rounding steps of each other there, and nothing compared after (the two runs then continue different text).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

TOP_LOGPROBS = 5
# The tiny model's logits come in bfloat16 steps of 0.125 (their logprobs differ by multiples of
# it), and exact ties between its top two candidates are common. Measured (tier test, CI's flake):
# a resumed request's winner 0.25 above the reference's, which was 0.125 above it there -- each
# logit moved by a step. The top two candidates are a median 1.5 nats apart (12 steps), and a
# wrong KV block moves every logit by about that much: a tie is at most 3 steps.
TIE_NATS = 3 * 0.125


def greedy(max_tokens: int) -> Any:
    """Greedy sampling with the top candidates' logprobs, for `assert_same_greedy_output`."""
    from vllm import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, logprobs=TOP_LOGPROBS)


def assert_same_greedy_output(got: Sequence[Any], expected: Sequence[Any]) -> None:
    """Each completion's tokens equal the reference's, or diverge only at a near tie."""
    assert len(got) == len(expected)
    for index, (ours, ref) in enumerate(zip(got, expected, strict=True)):
        assert len(ours.token_ids) == len(ref.token_ids), f"request {index}: lengths differ"
        _assert_diverges_only_at_a_tie(index, ours, ref)


def _assert_diverges_only_at_a_tie(index: int, ours: Any, ref: Any) -> None:
    assert ours.logprobs is not None, "sample with `greedy` for the logprobs"
    assert ref.logprobs is not None, "sample with `greedy` for the logprobs"
    for pos, (a, b) in enumerate(zip(ours.token_ids, ref.token_ids, strict=True)):
        if a == b:
            continue
        ours_top, ref_top = ours.logprobs[pos], ref.logprobs[pos]
        where = f"request {index}, token {pos}: {a} vs the reference's {b}"
        assert a in ref_top, f"{where}, not among the reference's top {TOP_LOGPROBS}"
        assert b in ours_top, f"{where}, the reference's not among our top {TOP_LOGPROBS}"
        gap = max(ref_top[b] - ref_top[a], ours_top[a] - ours_top[b])
        assert gap <= TIE_NATS, f"{where}, {gap:.3f} nats apart: no tie"
        return
