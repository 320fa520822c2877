"""The CPU attention guard: registered where vLLM looks for general plugins, off by the env var,
and -- on an AMX machine -- what keeps a short first request from killing the engine (the served
path: tests/server/test_http.py's first request is a short chat)."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest
import torch

from kvpool.vllm.launch import amx_guard


def test_vllm_finds_the_guard_among_its_general_plugins() -> None:
    (plugin,) = [p for p in entry_points(group="vllm.general_plugins") if p.name == "kvpool_amx_guard"]
    assert plugin.load() is amx_guard.register


@pytest.fixture
def amx_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)  # an AMX machine, wherever this runs


@pytest.mark.usefixtures("amx_probe")
def test_on_an_amx_cpu_vllm_is_told_there_is_no_amx(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(amx_guard.ENV, raising=False)
    amx_guard.register()
    assert torch.cpu._is_amx_tile_supported() is False
    amx_guard.register()  # vLLM may load plugins again in the same process
    assert torch.cpu._is_amx_tile_supported() is False


@pytest.mark.usefixtures("amx_probe")
def test_the_env_var_keeps_vllms_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(amx_guard.ENV, "1")
    amx_guard.register()
    assert torch.cpu._is_amx_tile_supported() is True
