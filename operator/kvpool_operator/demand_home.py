"""Loans home: in a round where no model wants memory, a loan its holder no longer uses goes back
toward the static split, so the next load to come finds its share waiting rather than claiming it.

Held where it was, idle memory stayed with the last burst: longtail's second model, lent down to
1 MiB before its ramp while the first held 4.25 MiB (its share 2.67) running one request, queued
its ramp's first requests for 2 s -- a round short, then a claim's round trip (stop 49, seed 0,
17.5 s: its worst request). The proportional policy spreads idle memory evenly every round and
had served the same arrival at once. Moved only at rest and only a loan, this never moves a
steady load's memory: at their shares, no model holds one.

Whether the next load is the holder's own or another's cannot be read: a holder whose load comes
back after its loan went home is short again and borrows again (a load on for four rounds and
off for two beside an idle model moved memory there and back every six rounds). So a holder
sends a loan home at most once a dwell and at least ``HOME_WAIT`` rounds apart
(``ModelMemory.last_home``; at the spec's default dwell of 3 rounds that load flapped every six),
and only after ``EBBED`` slack rounds. A loan sent home may cut its holder below its working set
over the dwell in a round whose needs fit: that memory is what its ebbed load no longer uses.
Home moves lie outside the demand policy's objective (the distance to the targets, whose holder's
target still carries its working set): they are a bet on the static split, bounded so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from kvpool_operator.demand_memory import EBBED, ModelMemory, upper_page
from kvpool_operator.policy import GroupPolicy, ModelBudget, Observation

HOME_WAIT = 8  #: rounds at least between two loans one holder sends home, whatever the dwell


def spare_loan(limit: int, fair: int, obs: Observation, mem: ModelMemory, per_request: float) -> int:
    """Bytes of a loan (a limit above the fair share) its holder does not use: nothing waits or was
    preempted, its load left or ebbed (``ModelMemory.quiet``, ``EBBED`` rounds ``slack``: one is a
    Poisson gap -- alternating bursts' busy model ran nothing for a round two seconds before its
    phase ended). It keeps its share, and room for one request more than it holds now."""
    if limit <= fair or obs.waiting_requests or obs.preemptions or not (mem.quiet or mem.slack_rounds >= EBBED):
        return 0
    return max(0, limit - max(fair, obs.used_bytes + int(per_request)))


def home_move(
    group: GroupPolicy,
    active: Sequence[ModelBudget],
    observed: Mapping[str, Observation],
    fair: Mapping[str, int],
    mems: Mapping[str, ModelMemory],
    default: float,
    free: int,
    now: int,
) -> tuple[str, str, int] | None:
    """(holder, model below its share, bytes) for a round in which no model wants memory and no
    budget lies free that the recipient would be granted: to the model furthest below its share (by
    weight), up to the page holding that share, from the holder with the most spare loan
    (``spare_loan``) that sent none home lately -- in whole pages of both pools, at most
    ``max_step``, at least the hysteresis and one of the recipient's requests or all it lacks:
    less is a resize that a Poisson load undoes."""
    below = [m for m in active if observed[m.name].limit_bytes < fair[m.name]]
    if not below:
        return None
    home = max(below, key=lambda m: (fair[m.name] - observed[m.name].limit_bytes) * m.weight)
    obs = observed[home.name]
    lacks = min(upper_page(fair[home.name] - obs.limit_bytes, obs.page_bytes), home.max_bytes - obs.limit_bytes)
    if free >= max(obs.page_bytes, min(lacks, group.hysteresis_bytes)):
        return None  # free budget serves the recipient once it wants memory: a shrink now moves nothing
    wait = max(group.dwell_rounds, HOME_WAIT)
    spares = {m.name: spare_loan(observed[m.name].limit_bytes, fair[m.name], observed[m.name], mems[m.name],
                                 mems[m.name].largest_request or default)
              for m in active if now - mems[m.name].last_home > wait}  # fmt: skip
    holder = max(spares, key=lambda n: spares[n], default=None)
    if holder is None:
        return None
    page = math.lcm(obs.page_bytes, observed[holder].page_bytes)
    amount = min(spares[holder], lacks, group.max_step_bytes) // page * page
    per = mems[home.name].per_request or default
    if amount <= 0 or amount < group.hysteresis_bytes or (amount < per and amount + page <= lacks):
        return None
    return holder, home.name, amount
