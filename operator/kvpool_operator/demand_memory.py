"""What the demand policy (``kvpool_operator.demand``) remembers of each model between rounds,
and how one round's observation folds into it: the need's EWMA (fast grow, slow shrink), the
use over the dwell (the working set), whether the model is short of memory and for how long, its
queue, whether its load looks gone (``looks_idle``), and whether it is short beside a loan
that stands idle (``beside_an_idle_loan``). Pure, like the policy: (memory,
observation) -> memory."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from kvpool_operator.policy import GroupPolicy, ModelBudget, Observation

RISE, DECAY, HEADROOM = 0.7, 0.5, 1.1
QUIET = 2  #: rounds in a row that its load looked gone (``idle``): the load left
IDLE = 4.0  #: ... finishing at most 1/IDLE of its peak rate over the dwell, at most 1/LEFT of the pool used
#: ... finishing at most 1/SLACK of it for one round: slack enough to give a burst what it does not
#: hold (a loan's holder; within its share, what its need leaves: ``demand.needs_of``)
SLACK = 2.0
PERSIST = 2  #: rounds in a row a model must be short before it is granted memory
QUEUE = 2.0  #: ... with this many requests waiting on average (EWMA, alpha 0.5), or as many as run
SURGE = 2 * QUEUE  #: or this many waiting in one round with the pool full: a burst, granted at once
LEFT = 2.0  #: a need ``LEFT`` times the limit: a load came
# finished in its busiest round of the dwell before a fall in the rate is a sign (``looks_idle``): a
# fourfold fall from it still leaves two a round, which a Poisson round seldom misses
RATE_SIGNAL = 2 * IDLE
FULL = 0.75  #: a pool this full with requests waiting is short of memory


@dataclass(frozen=True)
class ModelMemory:
    """What the policy remembers of one model between rounds."""

    need_ewma: float = 0.0
    recent_used: tuple[float, ...] = ()  #: bytes used in the latest rounds (the dwell)
    per_request: float = 0.0  #: bytes a running request holds (EWMA); 0 until one ran
    #: the most bytes per running request read in two rounds in a row (a request grows as it
    #: decodes), the lower of the two: one round's reading is no measure. used / running counts
    #: blocks that no running request holds -- likely those of requests that finished, held until
    #: their copy to the CPU tier completes, or of requests waiting for a load from it (with ten
    #: waiting, longtail's smallest model read 2.25 MiB for one request; the workload's largest is
    #: about 1.5), and an idle lender kept room for "one request" of 2.5 MiB beside a queue of 19.
    #: The price: a request still growing counts one round late. Still a maximum never forgotten
    #: (an idle lender needs it most when it ran nothing for long); ``per_request`` still takes
    #: every reading, smoothed.
    largest_request: float = 0.0
    #: bytes per running request in the previous round; 0 where none ran, nothing was used or the
    #: pool did not answer (so a reading after such a round is no pair)
    last_reading: float = 0.0
    last_grow: int = -(10**9)  #: round of the latest grant
    last_shrink: int = -(10**9)  #: round of the latest shrink
    short_rounds: int = 0  #: consecutive rounds short of memory, this one included
    #: consecutive rounds with requests waiting and none running: ``PERSIST`` of them is starved
    #: whatever the room (a request longer than any seen does not fit room sized by them; a queue
    #: of one behind nothing never grew ``deep``: its EWMA only nears 1) -- longtail's smallest
    #: model waited 6 s so at 1.25 MiB with one request queued
    stalled_rounds: int = 0
    waiting_ewma: float = 0.0  #: requests waiting (and preempted), smoothed
    deep: bool = False  #: ``waiting_ewma`` at ``QUEUE`` or at what runs (a small model's queue of 1-2 doubles its wait)
    #: a burst this round: short with a queue of ``SURGE``, or ``starved`` or stalled (or
    #: ``beside_an_idle_loan``)
    surge: bool = False
    #: a surge of one stalled request alone (``starved`` with less than ``QUEUE`` waiting; one
    #: preempted in the round is the one back in the queue): it claims room for that request, not
    #: its share (``stall_claim``)
    stall: bool = False
    #: short ``PERSIST`` rounds, deep, ``QUEUE`` waiting now, its queue now holding ``LEFT`` x its limit
    ramp: bool = False
    quiet_rounds: int = 0  #: consecutive rounds its load looked gone (``QUIET``), this one included
    #: ``looks_idle`` (all its gates) with a fall to 1/``SLACK`` of its peak, or ``holds_little``
    slack: bool = False
    finished_seen: int | None = None  #: the engine's finished-requests counter last round (None: not yet read)
    recent_finished: tuple[int, ...] = ()  #: requests finished in each of the latest rounds (the dwell)

    @property
    def quiet(self) -> bool:
        return self.quiet_rounds >= QUIET

    @property
    def working_set(self) -> float:
        """The peak of its recent use: over the dwell, or only the quiet rounds once its load left."""
        return max(self.recent_used[-QUIET:] if self.quiet else self.recent_used, default=0.0)


@dataclass(frozen=True)
class Memory:
    round: int = 0
    models: Mapping[str, ModelMemory] = field(default_factory=dict)


def short_of_memory(obs: Observation, per_request: float) -> bool:
    """Requests wait and the pool cannot take one more -- nothing runs, or the room left is under
    one request's bytes or a quarter of the limit -- or the engine preempted. Requests waiting
    beside room to spare mean the engine is short of compute, not memory."""
    if obs.preemptions > 0:
        return True
    if obs.waiting_requests == 0:
        return False
    room = obs.limit_bytes - obs.used_bytes
    return obs.running_requests == 0 or room < max(per_request, (1 - FULL) * obs.limit_bytes)


def recall(
    group: GroupPolicy, observed: Mapping[str, Observation], memory: Memory
) -> tuple[int, dict[str, ModelMemory], float]:
    """Fold one round's observations into every model's memory: (this round's number, the
    memories, the bytes a request is assumed to hold where none of a model's own has run -- the
    group's largest seen)."""
    seen = [mem.largest_request for mem in memory.models.values() if mem.largest_request > 0]
    default = max(seen, default=group.budget_bytes / (4 * len(group.models)))
    window = max(group.dwell_rounds, 1)
    mems = {m.name: remember(memory.models.get(m.name, ModelMemory()), observed[m.name], default, window)
            for m in group.models}  # fmt: skip
    return memory.round + 1, mems, default


def hurts(mem: ModelMemory) -> bool:
    """Memory hurts this model now: short ``PERSIST`` rounds with a queue deep enough, or a burst --
    short with a burst's queue, stalled, or short below its share beside an idle loan."""
    return (mem.short_rounds >= PERSIST and mem.deep) or mem.surge


def remember(prev: ModelMemory, obs: Observation, default_per_request: float, window: int) -> ModelMemory:
    """Fold one observation into a model's memory (its use over the latest ``window`` rounds).
    Until a request of its own has run, a model's requests are assumed to be
    ``default_per_request`` bytes (the group's largest seen), and so is its largest until a
    reading held two rounds (``largest_request``). A request preempted in the round is back in the
    queue or running: where neither holds one, they finished, and the preemptions are no shortage
    (read as one, a pool that preempted a burst's tail of ``SURGE`` as the burst ended was slack and
    a burst at once, claiming its share from the next burst)."""
    if obs.waiting_requests + obs.running_requests == 0:
        obs = replace(obs, preemptions=0)
    per, largest, reading = _request_sizes(prev, obs)
    assumed = per or default_per_request
    short = short_of_memory(obs, assumed)
    waiting = obs.waiting_requests + obs.preemptions
    wanted = obs.used_bytes + waiting * assumed if short else obs.used_bytes
    alpha = RISE if wanted > prev.need_ewma else DECAY
    need = prev.need_ewma + alpha * (wanted - prev.need_ewma)
    keep = max(window, QUIET)
    recent = (*prev.recent_used, float(obs.used_bytes))[-keep:]
    counted, done = _finished(prev, obs, keep)
    idle = looks_idle(obs, counted, done, IDLE)
    streak = prev.short_rounds + 1 if short else 0
    queue = 0.5 * prev.waiting_ewma + 0.5 * waiting
    stalled = prev.stalled_rounds + 1 if obs.waiting_requests > 0 and obs.running_requests == 0 else 0
    surge = short and (waiting >= SURGE or starved(obs, largest or default_per_request, stalled))
    quiet = prev.quiet_rounds + 1 if idle else 0
    deep = queue >= min(QUEUE, max(1, obs.running_requests))
    # a load that came: judged on the queue now, not on the need, which still carries a burst that
    # just left (judged on that, a model took a share from the next burst for a round and gave it
    # back); ``QUEUE`` waiting now, preemptions aside: a preempted request is back in the queue, and
    # counted twice, a cold model lent down to one request's room (one running, one waiting, one
    # preempted) read as a ramp and took its whole share from a burst at its peak for three rounds
    # (bursts+tier, seed 1, stop 42, 18 s)
    queued_now = obs.waiting_requests >= QUEUE
    ramp = streak >= PERSIST and deep and queued_now and wanted * HEADROOM >= LEFT * obs.limit_bytes
    return replace(prev, need_ewma=need, recent_used=recent, per_request=per, largest_request=largest,
                   last_reading=reading,
                   short_rounds=streak, stalled_rounds=stalled, waiting_ewma=queue, deep=deep, surge=surge,
                   stall=surge and obs.waiting_requests < QUEUE, ramp=ramp,
                   quiet_rounds=quiet,
                   slack=holds_little(obs, recent, done) or looks_idle(obs, counted, done, SLACK),
                   finished_seen=obs.finished_total, recent_finished=done)  # fmt: skip


def _request_sizes(prev: ModelMemory, obs: Observation) -> tuple[float, float, float]:
    """(bytes per running request smoothed, the largest read two rounds in a row, this round's
    reading or 0): see ``ModelMemory.largest_request``."""
    per, largest, reading = prev.per_request, prev.largest_request, 0.0
    if obs.running_requests > 0 and obs.used_bytes > 0:
        reading = obs.used_bytes / obs.running_requests
        per = reading if per == 0 else 0.5 * per + 0.5 * reading
        largest = max(largest, min(reading, prev.last_reading))
    return per, largest, reading


def _finished(prev: ModelMemory, obs: Observation, keep: int) -> tuple[bool, tuple[int, ...]]:
    """(whether the round's count of finished requests can be read -- the counter was read before
    and did not go back, as a restart sets it -- and the counts of the latest ``keep`` rounds)."""
    counted, finished = prev.finished_seen is not None, obs.finished_total - (prev.finished_seen or 0)
    done = (*prev.recent_finished, max(0, finished))[-keep:] if counted else ()
    return counted and finished >= 0, done


def starved(obs: Observation, per_request: float, stalled_rounds: int) -> bool:
    """Requests wait and none runs (``stalled_rounds``, this one included), and the room left
    cannot hold one -- or it stalled ``PERSIST`` rounds whatever the room: the pool starts nothing
    until it grows. Its wait is all loss, so it counts as a burst (claims at once: its fair share,
    or one request's room if only one waits, ``stall_claim``): a light model lent down to 1 MiB,
    below one of its 1.125-MiB requests, waited 3 s with one request queued -- a queue of one
    never reached the depth of a shortage."""
    if stalled_rounds == 0:
        return False
    return stalled_rounds >= PERSIST or obs.limit_bytes - obs.used_bytes < per_request


def holds_little(obs: Observation, recent_used: tuple[float, ...], done: tuple[int, ...]) -> bool:
    """Nothing waits, and nothing runs -- or, with nothing preempted in the round, where too few finish
    a round to read a fall in the rate (``RATE_SIGNAL``), what runs holds at most 1/``IDLE`` of its
    peak use over the dwell: its load fell, so it may give a burst what it does not hold (``slack``;
    if it holds or used a loan, ``demand.needs_of``), keeping room for one request. Judged on the
    rate alone, a pool whose burst ended with one long request still running, or that finished its
    burst's tail in the round its phase ended, was not slack: the next burst got its fair share
    back, and the rest three rounds later (alternating bursts' worst TTFTs came then). Where the
    rate can be read it decides: a steady load of short requests holds little at any moment and
    finishes many a round. A request preempted in the round is back in the queue or running: if
    neither holds one, they finished (a pool that preempted its burst's tail as the burst ended held
    the next burst at its share a round longer: alternating bursts, stop 44, seed 0, 38 s)."""
    if obs.waiting_requests > 0:
        return False
    if obs.running_requests == 0:
        return True
    if obs.preemptions > 0:
        return False
    return max(done, default=0) < RATE_SIGNAL and IDLE * obs.used_bytes <= max(recent_used, default=0.0)


def looks_idle(obs: Observation, counted: bool, done: tuple[int, ...], fall: float) -> bool:
    """Its load looks gone this round: nothing waits, the pool is at most half used, and it
    finished at most 1/``fall`` of its peak per round over the dwell. Concurrency alone was no
    sign: a steady load of short requests stands three quarters empty half the time, and giving
    its memory away cost it 3x at p99; the rate of finished requests falls ten times when a
    burst ends and seldom halves under a steady load. But a light load finishes a few a round,
    and a Poisson round with none reads as a fall: longtail's smallest model, two requests
    running, finishing 0-2 a round at its peak, was called idle and lent down to its working set
    -- its next four requests waited 2 s. So a fall counts only from a peak of ``RATE_SIGNAL``
    finished in a round; below it, a model with requests running is not idle -- the price: such a
    light load (under 8 requests/s at the default 1-s round; 0.8/s with 10-s rounds) lends only
    once its last request ended. A counter not yet read (or reset by a restart) is no sign either."""
    if obs.waiting_requests + obs.preemptions > 0 or LEFT * obs.used_bytes > obs.limit_bytes or not counted:
        return False
    if obs.running_requests > 0 and max(done) < RATE_SIGNAL:
        return False  # too few finish a round to see a fall: a load that runs is still there
    return fall * done[-1] <= max(done)


def beside_an_idle_loan(
    active: list[ModelBudget], observed: Mapping[str, Observation], fair: Mapping[str, int],
    mems: dict[str, ModelMemory],
) -> dict[str, ModelMemory]:  # fmt: skip
    """A model short below its fair share beside a loan that stands idle (``_stands_idle``) is a burst
    (``surge``) this round: it claims its share at once, and every burst rule applies to it -- a
    donor whose rate just halved (``slack``) may give to it down to what it holds if it holds or
    just used a loan (``demand.needs_of``), so the memory may come from another model than the idle
    holder, as for a burst of ``SURGE``. Waiting for a second short round or a queue of ``SURGE``, a
    burst stood one round at 2.75 MiB of its 8-MiB share beside a 13.25-MiB pool holding no request,
    and longtail's smallest model 2.5 s at 2.5 MiB of its 5.33 beside an 11-MiB pool running three
    requests (its worst requests came then). A loan in use is not idle: a queue of two beside it
    waits for a second round. Each holder is weighed alone: two part-idle loans do not add up to one
    claim. The flag lives one round: ``remember`` sets it afresh."""
    claims = {m.name for m in active
              if mems[m.name].short_rounds >= 1 and observed[m.name].limit_bytes < fair[m.name]
              and any(_stands_idle(observed[n.name], fair[n.name], fair[m.name] - observed[m.name].limit_bytes)
                      for n in active)}  # fmt: skip
    return {n: replace(mem, surge=True, stall=False) if n in claims else mem for n, mem in mems.items()}


def _stands_idle(obs: Observation, fair: int, lacks: int) -> bool:
    """A pool above the page holding its fair share (a loan; so never the claimant's own, below its
    share, nor one a third of a page above a share between two pages: claimed back as a loan, that
    page would go to and fro between two quiet models) with nothing waiting, that runs nothing
    (what it preempted then finished) or, nothing preempted, has at least ``lacks`` bytes unused
    now. Unused, not only above its share: the claim takes from the holder no more than its loan
    (``demand._room``), and what the surge lends besides comes from a donor whose own load
    slackened."""
    if obs.limit_bytes <= upper_page(fair, obs.page_bytes) or obs.waiting_requests > 0:
        return False
    if obs.running_requests == 0:  # what it preempted in the round finished (``remember``)
        return True
    return obs.preemptions == 0 and obs.limit_bytes - obs.used_bytes >= lacks


def need(m: ModelBudget, mem: ModelMemory) -> int:
    """What a model needs: what its load would hold (``wanted_by``) within its minimum and maximum."""
    return max(m.min_bytes, min(m.max_bytes, wanted_by(mem)))


def wanted_by(mem: ModelMemory) -> int:
    """What a model's load would hold, its maximum aside: a contested round's weight
    (``demand.targets``)."""
    return int(max(mem.working_set, mem.need_ewma) * HEADROOM)


def lends_to(target: int, fair: int, per_request: float, min_bytes: int) -> int:
    """How low a donor lends: its target, and below its fair share room for one request more
    than it uses (up to its share) -- of the largest it ran (``largest_request``, as read two
    rounds in a row): a request grows as it decodes, and the mean a running one held lent
    longtail's models below one. Lent down to its one-request working set, longtail's smallest
    model took two requests that came together one after the other: the second waited 3.1 s for
    a claim's round trip, 29x its static p99 (0.1 s). A target at the minimum is no use (what it
    uses is below the minimum): such a donor keeps one request. A model none of whose requests
    ran yet (two rounds in a row) keeps room for one of the group's largest (``Round.default``):
    lent down to 1 MiB before its ramp, longtail's second model could start none of its requests
    (1.125 MiB each) and waited for a claim while its queue grew to 14."""
    uses = target if target > min_bytes else 0
    return max(target, min(fair, uses + int(per_request)))


def upper_page(size: int, page: int) -> int:
    """``size`` rounded up to whole ``page``-byte pages: a pool holds whole pages, and the page
    holding a fair share is as near it as a pool gets (``demand._claim``)."""
    return -(-size // page) * page


def stall_claim(limit: int, fair: int, obs: Observation, per_request: float, page: int) -> int:
    """What one stalled request (``ModelMemory.stall``) claims below a fair share of ``fair``: room for
    it at ``per_request`` bytes (its own or the group's largest read, ``demand._claim``) in whole
    pages -- or the share where its pool has that room already (the request is longer than any read,
    or the claim did not start it). A donor whose own load slackened may still give it more, as to
    any burst (``demand._room``): that memory is not in use. Claiming its share, longtail's third
    model took 1.5 MiB from a model with 8 waiting for one request that then held 1 MiB (stop 48,
    seed 0, 18 s); the lender sat at its share with 13-20 waiting for 17 s."""
    holds = int((obs.used_bytes + obs.waiting_requests * per_request) * HEADROOM)
    wants = min(fair, holds) if holds > limit else fair
    return upper_page(wants - limit, page)


def buys_a_request(obs: Observation, amount: int, per: float) -> bool:
    """The move lets the pool start a request it cannot start now: nothing runs in it (its
    waiting requests do not fit), or its room after the move holds one request more than now.
    Less than one request's bytes is worth a move only then: at shares of ~2 requests (8 MiB,
    three models), a ramping model lent down to 1 MiB ran nothing for 13 s with up to 14 queued,
    refused 0.75 MiB from a pool of 4.5 above its target because that is less than a request."""
    room = max(0, obs.limit_bytes - obs.used_bytes)
    return obs.running_requests == 0 or math.floor((room + amount) / per) > math.floor(room / per)
