"""The timer's cadence (``handlers.due``): a round every interval start to start, timed in-process,
from the status only after a restart; and kopf's per-tick success line kept out of the log."""

from __future__ import annotations

import datetime as dt
import logging

from kvpool_operator.handlers import TICK_S, _QuietTicks, due


def _at(seconds_ago: float) -> dict[str, dict[str, str]]:
    then = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=seconds_ago)
    return {"balance": {"lastRoundTime": then.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}}


def test_a_round_is_due_one_interval_after_the_last_one_started_on_the_tick_that_reaches_it() -> None:
    start = 100.0
    ticks = [start + k * TICK_S for k in range(1, 9)]
    assert next(t for t in ticks if due({}, 1.0, start, t)) == start + 1.0
    assert not due({}, 1.0, start, start + 1.0 - TICK_S)


def test_the_operators_own_timing_wins_over_a_status_a_round_old() -> None:
    # the body handed to the tick still shows the round before last: read alone, it says "due"
    assert due(_at(5.0), 1.0, None, 0.0)
    assert not due(_at(5.0), 1.0, 100.0, 100.5)


def test_after_a_restart_the_status_decides_and_an_empty_one_starts_a_round() -> None:
    assert due({}, 10.0, None, 0.0)
    assert not due(_at(3.0), 10.0, None, 0.0)
    assert due(_at(10.0), 10.0, None, 0.0)


def test_only_the_timers_per_tick_success_line_is_dropped() -> None:
    def record(msg: str) -> logging.LogRecord:
        return logging.LogRecord("kopf.objects", logging.INFO, __file__, 1, msg, None, None)

    quiet = _QuietTicks()
    assert not quiet.filter(record("Timer 'balance' succeeded."))
    assert quiet.filter(record("Handler 'run_group' succeeded."))
    assert quiet.filter(record("Timer 'balance' failed with an exception and will try again in 60 seconds: x"))
