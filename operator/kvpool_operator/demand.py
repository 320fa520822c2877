"""The demand policy: move memory only where it hurts now, one move per round, never below what
a model is using. Pure: (group, observations, memory of earlier rounds) -> (plan, new memory).

Why not utilisation (the proportional policy, ``kvpool_operator.policy.plan``): a pool fills up
under any load, so utilisation says "busy", not "short of memory"; acting on it moved limits
8 -> 12 -> 8 MiB in consecutive rounds. Here a model is *short* when requests wait and its pool
cannot take one more (nothing runs, or less than a request's bytes is left) or when it preempted
-- waiting beside room to spare means the engine is short of compute, not memory; its *need* is
what it holds plus what its waiting and preempted requests would hold (a claim below a fair
share counts only those waiting, ``_claim``):

    need_i   = max(working set, EWMA of (used + (waiting + preempted) x bytes per request)) x 1.1
    target_i = need_i if the needs fit; else min(need_i, fair share) first, the rest by weight x
               what its load would hold (``targets``), none above its need (min/max hold)
    a move   = donor -> recipient, at most max_step, at least hysteresis:
               recipient: the short model furthest below its target that a move may serve
                          (free budget first)
               donor:     the model with the most it may give (below) -- never below its
                          target and a request (a ramp's or burst's claim where the needs fit)
                          but for a claim of a static share in a contested round (down to the
                          lender's share), so never below its working set unless the budget is
                          contested (where a burst's round also counts only what a slack loan
                          holder holds, if the needs as read take it)

Against flapping (a steady load must not move memory back and forth) while a burst is served
within a round or two: the dwell separates noise from a change of load.

* grant: a model must be short two rounds in a row with two or more requests waiting (or
  preempted) on average, or as many as it runs (a Poisson spike is not a trend; a small model's
  queue of one or two doubles its waits) -- or short with a burst's queue (``SURGE``) at once;
* a model that grew keeps its grant for ``dwell_rounds``, one that shrank is not granted again
  within them from a donor whose load is still there -- unless the load has changed: a donor that
  for ``QUIET`` rounds had nothing waiting, its pool at most half used, and finished requests at a
  quarter of its peak rate over the dwell or less (a peak of ``RATE_SIGNAL`` a round; a lighter load
  must have nothing running) has lost its load (see ``demand_memory.looks_idle``) and gives to
  anyone short; a recipient whose need is ``LEFT`` times its limit has gained one (the dwell held
  both at the phase changes of alternating bursts and handed memory over 3-6 s late);
* a grant above a model's fair share (the budget water-filled by weight up to every maximum, what a
  static split gives it) is a loan: a model short below its share takes it back within any dwell,
  its own or the lender's, down to the lender's share (where the needs do not take the whole budget,
  down to the lender's target if that is more) and up to what its queue needs (``_claim``); it never
  waits a dwell for a loan of its static share, and a ramp or a burst takes its whole share back at
  once (where the needs fit, from any donor down to its target and a request; a pool stalled on one
  request, room for it: ``demand_memory.stall_claim``). Else a model whose load is still there lends
  below its share only to one short for ``LOAN`` rounds (lent after two, it recalled the loan at its
  next spike: a flap) -- or to a burst once its own load slackened for a round or its use fell
  fourfold, nothing waiting (``ModelMemory.slack``): down to what it holds if it holds a loan or
  used one over the dwell (the burst that just ended), else down to its need (a light load's gap);
* a model short for one round below its share while another holds more than its own with nothing
  of it waiting, and runs nothing or (nothing preempted) has as much unused as the first lacks
  (``beside_an_idle_loan``), claims its share at once, as a burst does;
* a donor keeps room for its working set, the peak of its use over the dwell -- or over the quiet
  rounds once its load left. Giving a steady load's memory away down to its momentary use made
  it short seconds later (8 moves a minute with a two-round window). Below its fair share it
  keeps room for one request more than it uses (``lends_to``): two requests arriving together
  must not wait for a claim's round trip -- and an idle one keeps room for one, not nothing.

A spec change that leaves limits above a maximum or over the budget is undone first, by shrinks
alone (the Balancer applies them before any grant). Fast grow, slower shrink: the need's EWMA rises
with alpha 0.7 and decays with 0.5. A move from a donor is at least one of the recipient's requests
(and the hysteresis), or lets it start one it cannot start now (``demand_memory.buys_a_request``):
other small ones were fix-ups that a Poisson load undoes; a grant from free budget is at least the
hysteresis, all the recipient lacks, or its claim. Moves are whole pages; a claim of a share between
two is the upper page (``_claim``), up to a page past a target.

Objective: the distance of the limits from the targets, sum |limit - target|, plus each model's
shortfall below its fair share or its target if that is less, sum max(0, min(fair, target) -
limit): a static split's guarantee first. A move gives at most the recipient's shortfall (to the
page holding its share: it leaves no shortfall, and overshoots by less than a page) and
takes at most the donor's excess over its target -- or, for a claim of a share in a contested
round, over the donor's share -- so every move lowers it (by the bytes moved at least), but for
the part of a page a claim of a share between two rounds up to; a round with no such move worth
the hysteresis plans nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from kvpool_operator.demand_memory import (
    HEADROOM,
    LEFT,
    Memory,
    ModelMemory,
    beside_an_idle_loan,
    buys_a_request,
    hurts,
    lends_to,
    need,
    recall,
    stall_claim,
    upper_page,
    wanted_by,
)
from kvpool_operator.policy import (
    GroupPolicy,
    Infeasible,
    ModelBudget,
    Observation,
    Plan,
    check_feasible,
    fair_shares,
    restore_bounds,
    water_fill,
)

LOAN = 4  #: rounds short before a donor whose load is still there lends below its fair share


def needs_of(
    models: list[ModelBudget], mems: Mapping[str, ModelMemory], budget: int, limits: Mapping[str, int]
) -> tuple[dict[str, int], dict[str, int], bool]:
    """Each model's need and whether together they take the whole ``budget`` or more (``limits``: this
    round's, which tell a loan's holder; contested: a need at a model's maximum may be larger still
    -- a burst at its share beside an idle model at its minimum need summed to the budget exactly,
    so the burst took nothing from the idle model's share for the dwell of that model's grant while
    eight of its requests waited; bursts, seed 1 of stop 42's run, 7-10 s). Where the needs as read
    take the budget and a model bursts (``SURGE``), a model whose load looked gone for a round needs
    only what it holds: its working set over the dwell and its need's EWMA still carry the burst it
    just served, and held its target -- and so the new burst's -- at the old split for a second
    round of each phase of alternating bursts -- a round whose finishing rate halved, or whose use
    fell fourfold (``ModelMemory.slack``), is enough: waiting for a quarter of the peak rate, the
    next burst waited at its share 3 s for the last one's tail. Only a loan's holder needs so little
    (its limit now or its use over the dwell above its fair share): a light load within its share is
    slack whenever a Poisson gap leaves it running nothing for a round, and lent down to one
    request's room, longtail's smallest model queued its next two requests ~3 s for a claim (stop
    43, its worst); steady's models were lent away at such dips and took it back (8 resizes a model
    a minute with the tier on). A ramp or a burst (``ModelMemory.ramp``, ``surge``) needs at least
    its fair share, as a static split gives it: claiming a round's queue at a time, longtail's
    smallest model reached its share 17 s into its ramp. Contested too when that floor makes the
    needs take the budget: a claim of the share is then a static split's guarantee (``_room``); read
    before the floor, such a claim got only a lender's excess over a target that the water-fill of
    the lower needs had raised above the lender's share. Beside the needs, what each load would hold
    past its maximum (``wanted_by``, floored at its need): ``targets``' weights."""
    needs = {m.name: need(m, mems[m.name]) for m in models}
    wanted = {m.name: wanted_by(mems[m.name]) for m in models}
    contested = sum(needs.values()) >= budget
    fair = fair_shares(models, budget)
    if contested and any(mems[m.name].surge for m in models):
        for m in models:
            mem = mems[m.name]
            if mem.slack and not mem.quiet and max(limits[m.name], mem.working_set) > fair[m.name]:
                lately = mem.recent_used[-1]
                needs[m.name] = need(m, replace(mem, recent_used=(lately,), need_ewma=lately))
                wanted[m.name] = needs[m.name]
    for m in models:
        if mems[m.name].ramp or mems[m.name].surge:
            needs[m.name] = max(needs[m.name], fair[m.name])
    wanted = {n: max(w, needs[n]) for n, w in wanted.items()}
    return needs, wanted, contested or sum(needs.values()) >= budget


def targets(
    models: list[ModelBudget], needs: Mapping[str, int], wanted: Mapping[str, int], budget: int
) -> dict[str, int]:
    """Everyone's need if the budget allows; otherwise each one's need up to its fair share first (a
    static split's guarantee), the rest by weight times what its load would hold (``wanted``, past
    its maximum), none above its need. Split max-min by need (stop 46), longtail's second model held
    3.5 MiB with 30 requests waiting beside the third's 3.5 with 8 for 12 s -- both needs at their
    maximum read alike -- and its worst requests waited 24 s (0.96x static; proportional 0.50x)."""
    fair = fair_shares(models, budget)
    floored = [replace(m, min_bytes=max(m.min_bytes, min(needs[m.name], fair[m.name]))) for m in models]
    return water_fill(floored, {m.name: m.weight * max(1, wanted[m.name]) for m in models}, needs, budget)


def plan_demand(
    group: GroupPolicy, observed: Mapping[str, Observation], memory: Memory
) -> tuple[Plan | Infeasible, Memory]:
    """One round: remember, then at most one move (see the module docstring)."""
    problem = check_feasible(group, observed)
    if problem is not None:
        return problem, memory
    now, mems, default = recall(group, observed, memory)
    old = {m.name: observed[m.name].limit_bytes for m in group.models}
    active = [m for m in group.models if observed[m.name].reachable]
    pinned = sum(old[m.name] for m in group.models if not observed[m.name].reachable)
    fair = fair_shares(active, group.budget_bytes - pinned)
    mems = beside_an_idle_loan(active, observed, fair, mems)
    needs, wanted, contested = needs_of(active, mems, group.budget_bytes - pinned, old)
    target = targets(active, needs, wanted, group.budget_bytes - pinned)
    restored = restore_bounds(group, active, old, target)
    if restored is not None:  # a spec change put limits above a maximum or the budget: fix that first
        shrinks = tuple(n for n in restored if restored[n] < old[n])
        return Plan(restored, shrinks, ()), Memory(now, mems)
    new = dict(old)
    free = group.budget_bytes - sum(old.values())
    move = _one_move(Round(group, active, observed, target, fair, mems, now, free, default, contested))
    if move is not None:
        donor, recipient, amount = move
        if donor is not None:
            new[donor] -= amount
            mems[donor] = replace(mems[donor], last_shrink=now)
        new[recipient] += amount
        mems[recipient] = replace(mems[recipient], last_grow=now)
    shrinks = tuple(n for n in new if new[n] < old[n])
    grows = tuple(n for n in new if new[n] > old[n])
    return Plan(new, shrinks, grows), Memory(now, mems)


def _settled(m: ModelBudget, limit: int, mem: ModelMemory, now: int, dwell: int) -> bool:
    """Past the dwell of its latest shrink, or its need is ``LEFT`` times its limit (a load that
    came): a model that just gave memory away takes it back from a busy one only at a change."""
    return now - mem.last_shrink > dwell or need(m, mem) >= LEFT * limit


def _claim(limit: int, fair: int, obs: Observation, mem: ModelMemory, default: float) -> int:
    """Bytes a model short below its fair share takes back within any dwell: up to its share, or to
    what it holds and its queue would hold if that is less -- unless it ramps or bursts (``ramp``,
    ``surge``): then its share (a stall of one request: its room, ``stall_claim``; 0: no claim).
    Claiming a queue's bytes a round at a time, a burst spent 3 s below its share and built a queue
    its phase never drained. A grant above a share is a loan while the others do not need it: held
    for a dwell against a model short below its share, it kept longtail's second model at 1.25 MiB
    for 8 s with ten requests waiting. Short of a burst, its queue, not its target, bounds it: a
    cold model's target still carries its last burst's working set, and one round's queue of two
    took a hot model's memory down to its share. Its queue is what waits now: a request preempted in
    the round is back in it (or running again, in what it holds); counted twice, a cold model
    running one request with one waiting claimed room for three. A claim of its share is in whole
    pages, up to the page holding the share: a pool holds whole pages, and the 0.17 MiB below a
    2.67-MiB share was less than one -- longtail's third model waited 9 s there with 3-8 requests
    queued (stop 47, seed 1)."""
    if limit >= fair or not hurts(mem):
        return 0
    if mem.stall:
        return stall_claim(limit, fair, obs, max(mem.per_request, default), obs.page_bytes)
    holds = (obs.used_bytes + obs.waiting_requests * (mem.per_request or default)) * HEADROOM
    # a ramp or a burst: its share before the next arrivals, not a queue's bytes per round
    wants = fair if mem.ramp or mem.surge else min(fair, int(holds))
    if wants == fair:  # whole pages: a share between two is the upper one
        return upper_page(fair - limit, obs.page_bytes)
    return max(0, wants - limit)


@dataclass(frozen=True)
class Asks:
    """The recipient of a round, as a donor's ``_room`` weighs it."""

    settled: bool  #: past the dwell of its latest shrink, or its load came (``_settled``), or below its minimum
    claim: int  #: bytes it takes back below its fair share (to the page holding it) within any dwell (``_claim``)
    burst: bool  #: a burst (``ModelMemory.surge``) in a round whose needs exceed the budget
    #: a ramp or a burst: its claim is its whole fair share (a stall: its request's room first, ``_claim``)
    share: bool
    short_rounds: int


def _room(m: ModelBudget, r: Round, asks: Asks) -> int:
    """What a donor may give this round. Down to its target (below its share, keeping room for one
    request more, ``lends_to``): once its load left (``QUIET``: idle memory goes to anyone short);
    to a burst once its own load slackened for a round (``slack``; its target then is what it holds
    if it holds or used a loan and the needs as read take the budget, else its need, ``needs_of``);
    past the dwell of its latest grant to a settled model short for ``LOAN`` rounds. Down to its
    fair share and target: past that dwell to a settled model. Whatever the dwells, as much as a
    model below its own share claims back (``_claim``) -- in a contested round down to the lender's
    share, its target aside: the needs take the whole budget, and a static split's guarantee comes
    first; where they fit, a ramp's or burst's claim comes also from what a donor does not need,
    down to its target and a request more (``lends_to``): a burst at half its share beside a model
    holding twice its need within its own share waited ``LOAN`` rounds for memory no one used. A
    slack donor gives a burst the claim too, if more than its target allows: its need falls to what
    it holds only where the needs as read take the budget (``needs_of``), not in a round contested
    by the burst's share alone. Kept to the lender's target (its need water-filled beside the
    claimant's, above its share), longtail's second model ramped at 1-2.25 MiB of its 2.67-MiB
    share for 7 s with 4-9 requests queued, its claim cut to part of the loan and, past the
    lender's dwell, to nothing (stop 44, seed 0). A donor whose load was still there lent below its
    share after two short rounds of another's and took it back at its next spike (the steady load's
    memory went there and back in 4 s)."""
    limit, target, fair, mem = r.limit(m.name), r.target[m.name], r.fair[m.name], r.mems[m.name]
    floor = lends_to(target, fair, mem.largest_request or r.default, m.min_bytes)
    above = max(0, limit - max(target, fair))
    claimed = min(max(0, limit - (fair if r.contested else max(target, fair))), asks.claim)
    if not r.contested and asks.share:  # every need fits: a ramp's or burst's share, from what a donor does not need
        claimed = max(claimed, min(max(0, limit - floor), asks.claim))
    if mem.quiet or (asks.burst and mem.slack):
        return max(claimed, limit - floor)
    if r.now - mem.last_grow > r.group.dwell_rounds and asks.settled:
        return max(claimed, max(0, limit - floor) if asks.short_rounds >= LOAN else above)
    return claimed


@dataclass(frozen=True)
class Round:
    """What every candidate move of one round is weighed against."""

    group: GroupPolicy
    active: list[ModelBudget]  #: the reachable models (an unreachable one keeps its limit)
    observed: Mapping[str, Observation]
    target: Mapping[str, int]  #: the needs, or where they take the budget, its split (``targets``)
    fair: Mapping[str, int]  #: the static split of the budget by weight (``fair_shares``)
    mems: Mapping[str, ModelMemory]
    now: int  #: this round's number
    free: int  #: budget no limit holds
    #: bytes per request of a model none of whose requests ran yet (or none two rounds in a row):
    #: the group's largest seen
    default: float
    #: the needs take the whole budget or more: before ``needs_of`` lowered a slack loan's, or after
    #: it raised a ramp's or burst's to its share
    contested: bool

    def limit(self, name: str) -> int:
        return self.observed[name].limit_bytes


def _wanting(r: Round) -> list[ModelBudget]:
    """Models below their minimum if any, else those short (``hurts``) below their targets: those
    below their fair share first (an idle donor's memory went to a model above its share while
    longtail's smallest, below its own, waited 3 s), then furthest below its target (by weight)."""
    below = [m for m in r.active if r.observed[m.name].below(m.min_bytes)]
    short = [m for m in r.active if r.target[m.name] > r.limit(m.name) and hurts(r.mems[m.name])]

    def order(m: ModelBudget) -> tuple[bool, float]:
        return r.limit(m.name) < r.fair[m.name], (r.target[m.name] - r.limit(m.name)) * m.weight

    return sorted(below or short, key=order, reverse=True)


def _one_move(r: Round) -> tuple[str | None, str, int] | None:
    """(donor or None for free budget, recipient, bytes) for the first wanting model that a move
    may serve, or None. The first in line may be held by its dwell while the next could be
    served: trying only the first starved the others for that dwell."""
    for recipient in _wanting(r):
        mem, obs = r.mems[recipient.name], r.observed[recipient.name]
        settled = obs.below(recipient.min_bytes) or _settled(recipient, obs.limit_bytes, mem, r.now,
                                                             r.group.dwell_rounds)  # fmt: skip
        asks = Asks(settled, _claim(obs.limit_bytes, r.fair[recipient.name], obs, mem, r.default),
                    mem.surge and r.contested, mem.ramp or mem.surge, mem.short_rounds)  # fmt: skip
        move = _move_to(r, recipient, asks)
        if move is not None:
            return move
    return None


def _move_to(r: Round, recipient: ModelBudget, asks: Asks) -> tuple[str | None, str, int] | None:
    """The move to ``recipient``: from free budget, else from the donor that may give the most
    (``_gives``), in whole pages of both pools (a pool rounds its limit down, and the bytes one
    rounded away were granted from free budget in the next round: a second resize for nothing); None
    if none is worth it."""
    name, obs, group = recipient.name, r.observed[recipient.name], r.group
    deficit = min(r.target[name], recipient.max_bytes) - obs.limit_bytes
    if deficit > 0 and obs.limit_bytes + asks.claim >= r.fair[name]:  # a claim of its share: to its page
        deficit = min(max(deficit, min(asks.claim, upper_page(deficit, obs.page_bytes))),
                      recipient.max_bytes - obs.limit_bytes)  # fmt: skip
    if deficit < obs.page_bytes:  # the pool would round the grant away
        return None
    wants = deficit if asks.settled else min(deficit, asks.claim)
    grant = min(wants, r.free, group.max_step_bytes) // obs.page_bytes * obs.page_bytes
    whole = deficit // obs.page_bytes * obs.page_bytes
    # a claim is worth its pages from free budget too (a stall's room can be under the hysteresis)
    if grant > 0 and (grant >= group.hysteresis_bytes or grant == whole or 0 < asks.claim <= grant):
        return None, name, grant
    gives = {m.name: _gives(r, m, recipient, asks, deficit) for m in r.active if m is not recipient}
    donor = max(gives, key=lambda n: gives[n], default=None)
    if donor is None or gives[donor][0] <= 0:
        return None
    amount, page = gives[donor][0], math.lcm(obs.page_bytes, r.observed[donor].page_bytes)
    per = r.mems[name].per_request or r.default
    # what restores a claim is worth any whole page: a burst at 3.5 of its 4 MiB share, six waiting,
    # was refused the last half MiB (less than one request) for three rounds
    restores = 0 < asks.claim <= amount + page
    worth = amount >= max(group.hysteresis_bytes, per) or (
        amount >= group.hysteresis_bytes and buys_a_request(obs, amount, per)
    )
    if amount <= 0 or not (worth or obs.below(recipient.min_bytes) or restores):
        return None
    return donor, name, amount


def _gives(r: Round, m: ModelBudget, recipient: ModelBudget, asks: Asks, deficit: int) -> tuple[int, int, int]:
    """A donor's rank: the whole pages it may give ``recipient`` this round, then how much of that
    lies above both its target and its fair share (memory it does not need), then its room. Where
    two donors may give as much, the one holding a loan it does not use gives: ranked on room
    alone, a claim of a share could cut a lender below its target beside such a loan."""
    room = _room(m, r, asks)
    page = math.lcm(r.observed[recipient.name].page_bytes, r.observed[m.name].page_bytes)
    amount = min(deficit, room, r.group.max_step_bytes) // page * page
    spare = max(0, r.limit(m.name) - max(r.target[m.name], r.fair[m.name]))
    return amount, min(amount, spare), room
