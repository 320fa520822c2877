"""The node ledger: one physical budget for every pool of a pod, across processes, surviving the
death of any of them."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
from pathlib import Path

import pytest

from kvpool.errors import ConfigError, PoolExhausted
from kvpool.ledger import Ledger

MiB = 1 << 20


def test_debits_within_the_budget_pass_and_an_overdraft_is_refused_naming_it(tmp_path: Path) -> None:
    a = Ledger(tmp_path / "l", "a:0", 10 * MiB)
    b = Ledger(tmp_path / "l", "b:0", 10 * MiB)
    a.debit(6 * MiB)
    b.debit(4 * MiB)
    with pytest.raises(PoolExhausted, match=r"budget of 10485760 \(in use 10485760"):
        a.debit(1)
    assert a.state().owners == {"a:0": 6 * MiB, "b:0": 4 * MiB}  # the refusal changed nothing
    b.credit(4 * MiB)
    a.debit(4 * MiB)
    assert b.state().used_bytes == 10 * MiB


def test_credit_never_goes_below_zero_and_close_leaves_the_ledger(tmp_path: Path) -> None:
    a = Ledger(tmp_path / "l", "a:0", MiB)
    b = Ledger(tmp_path / "l", "b:0", MiB)
    a.debit(100)
    a.credit(1000)
    assert a.state().owners["a:0"] == 0
    a.debit(MiB)
    a.close()
    b.debit(MiB)  # a's bytes were released with it
    assert b.state().owners == {"b:0": MiB}


def _debit_until_refused(path: str, owner: str, step: int, out: mp.Queue) -> None:  # type: ignore[type-arg]
    ledger = Ledger(path, owner, 64 * MiB)
    taken = 0
    try:
        while True:
            ledger.debit(step)
            taken += step
    except PoolExhausted:
        out.put((owner, taken, ledger.state().used_bytes))
    out.put(("done", 0, 0))
    signal.pause()  # stay alive (and counted) until the test ends us


@pytest.mark.slow
def test_concurrent_processes_never_overdraw_and_every_debit_is_counted(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_debit_until_refused, args=(str(tmp_path / "l"), f"m{i}:0", 64 * 1024 + i * 4096, out))
             for i in range(4)]  # fmt: skip
    for p in procs:
        p.start()
    try:
        results = [out.get(timeout=60) for _ in range(8)]
        taken = {o: t for o, t, _ in results if o != "done"}
        seen = [u for o, _, u in results if o != "done"]
        assert sum(taken.values()) <= 64 * MiB
        assert max(seen) <= 64 * MiB
        final = Ledger(tmp_path / "l", "observer:0", 64 * MiB).state()
        assert final.owners == {**taken, "observer:0": 0}  # every successful debit, nothing else
        assert 64 * MiB - final.used_bytes < 64 * 1024 + 4 * 4096  # refused only when nearly full
    finally:
        for p in procs:
            p.kill()
            p.join()


def _debit_and_wait(path: str, ready: mp.Event) -> None:  # type: ignore[type-arg]
    Ledger(path, "victim:0", 8 * MiB).debit(8 * MiB)
    ready.set()
    signal.pause()


@pytest.mark.slow
def test_a_killed_owner_releases_its_bytes_at_the_next_transaction(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    victim = ctx.Process(target=_debit_and_wait, args=(str(tmp_path / "l"), ready))
    victim.start()
    assert ready.wait(60)
    other = Ledger(tmp_path / "l", "other:0", 8 * MiB)
    with pytest.raises(PoolExhausted):
        other.debit(1)  # the victim is alive: its 8 MiB count
    os.kill(victim.pid, signal.SIGKILL)  # type: ignore[arg-type]
    victim.join()
    other.debit(8 * MiB)  # killed, however it died: its bytes are free again
    assert other.state().owners == {"other:0": 8 * MiB}


def test_a_live_owner_cannot_be_opened_twice_and_a_restarted_one_starts_from_zero(tmp_path: Path) -> None:
    first = Ledger(tmp_path / "l", "a:0", MiB)
    first.debit(MiB)
    with pytest.raises(ConfigError, match="held by a live process"):
        Ledger(tmp_path / "l", "a:0", MiB)
    first.close()
    again = Ledger(tmp_path / "l", "a:0", MiB)
    assert again.state().owners == {"a:0": 0}


@pytest.mark.parametrize(("owner", "budget", "field"), [("a:0", 0, "budget_bytes"), ("a b", 1, "owner"),
                                                          ("lock", 1, "owner")])  # fmt: skip
def test_bad_settings_name_the_field(tmp_path: Path, owner: str, budget: int, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        Ledger(tmp_path / "l", owner, budget)
