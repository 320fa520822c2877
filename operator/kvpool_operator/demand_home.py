"""Loans home: in a round where no model wants memory, a loan its holder no longer uses goes back
toward the static split, so the next load to come finds its share waiting rather than claiming it.

Held where it was, idle memory stayed with the last burst: longtail's second model, lent down to
1 MiB before its ramp while the first held 4.25 MiB (its share 2.67) running one request, queued
its ramp's first requests for 2 s -- a round short, then a claim's round trip (stop 49, seed 0,
17.5 s: its worst request). The proportional policy spreads idle memory evenly every round and
had served the same arrival at once. Moved only at rest and only a loan, this never moves a
steady load's memory: at their shares, no model holds one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from kvpool_operator.demand_memory import QUIET, ModelMemory, upper_page
from kvpool_operator.policy import ModelBudget, Observation


def spare_loan(limit: int, fair: int, obs: Observation, mem: ModelMemory, per_request: float) -> int:
    """Bytes of a loan (a limit above the fair share) its holder does not use: nothing waits or was
    preempted, its load left or slackened two rounds in a row (``ModelMemory.quiet``,
    ``slack_rounds``: one is a Poisson gap -- alternating bursts' busy model ran nothing for a round
    two seconds before its phase ended); it keeps its share, and room for one request more than it
    holds now above that."""
    if limit <= fair or obs.waiting_requests or obs.preemptions or not (mem.quiet or mem.slack_rounds >= QUIET):
        return 0
    return max(0, limit - max(fair, obs.used_bytes + int(per_request)))


def home_move(
    active: Sequence[ModelBudget],
    observed: Mapping[str, Observation],
    fair: Mapping[str, int],
    mems: Mapping[str, ModelMemory],
    default: float,
    hysteresis: int,
) -> tuple[str, str, int] | None:
    """(holder, model below its share, bytes) for a round in which no model wants memory: the holder
    with the most spare loan (``spare_loan``) gives it to the model furthest below its share (by
    weight), up to the page holding that share, in whole pages of both pools. At least one of the
    recipient's requests or all it lacks, and the hysteresis: less is a resize a Poisson load undoes."""
    spare = {m.name: spare_loan(observed[m.name].limit_bytes, fair[m.name], observed[m.name], mems[m.name],
                                mems[m.name].largest_request or default) for m in active}  # fmt: skip
    holder = max(spare, key=lambda n: spare[n], default=None)
    below = [m for m in active if observed[m.name].limit_bytes < fair[m.name]]
    if holder is None or spare[holder] <= 0 or not below:
        return None
    home = max(below, key=lambda m: (fair[m.name] - observed[m.name].limit_bytes) * m.weight)
    obs = observed[home.name]
    page = math.lcm(obs.page_bytes, observed[holder].page_bytes)
    lacks = upper_page(fair[home.name] - obs.limit_bytes, obs.page_bytes)
    amount = min(spare[holder], lacks, home.max_bytes - obs.limit_bytes) // page * page
    per = mems[home.name].per_request or default
    if amount < hysteresis or (amount < per and amount + page <= lacks):
        return None
    return holder, home.name, amount
