"""Settings: every option is documented in --help, bad values stop the start with the option's
name, and the environment works as well as flags."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from kvpool_server.cli import parse_settings, pool_config, vllm_argv
from kvpool_server.settings import ServerSettings


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvpool_server", *args], capture_output=True, text=True,
                          timeout=120, env=env)  # fmt: skip


def test_help_documents_every_option() -> None:
    out = run_cli("--help")
    assert out.returncode == 0
    for name in ServerSettings.model_fields:
        assert "--" + name.replace("_", "-") in out.stdout, name
    assert "Physical KV bytes per worker at start" in out.stdout  # the engine config's own words


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--port", "0"], "--port (env KVPOOL_PORT): Input should be greater than or equal to 1"),
        (["--limit-bytes", "lots"], "--limit-bytes"),
        (["--limit-bytes", "4Gi", "--virtual-bytes", "1Gi"], "must not exceed virtual-bytes"),
        (["--backend", "tpu"], "--backend"),
        (["--admin-token-file", "/nonexistent/token"], "admin-token-file /nonexistent/token does not exist"),
        (["--offload-bytes", "1Gi", "--offload-dir", "/nonexistent"], "offload-dir /nonexistent is not a directory"),
        (["--offload-policy", "fifo"], "--offload-policy"),
        (["--preempt-after-s", "-1"], "--preempt-after-s (env KVPOOL_PREEMPT_AFTER_S): Input should be greater"),
    ],
)
def test_bad_values_stop_the_start_naming_the_option(args: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_settings(args)
    assert message in str(exc.value)


def test_an_unknown_flag_is_an_error() -> None:
    out = run_cli("--no-such-flag", "1")
    assert out.returncode != 0
    assert "kvpool-server: error: unrecognized arguments: --no-such-flag" in out.stderr


def test_a_model_folder_that_does_not_exist_is_one_line_naming_it(tmp_path: Path) -> None:
    out = run_cli("--model", str(tmp_path / "missing"))
    assert out.returncode == 1
    assert out.stderr.startswith(f"kvpool-server: error: model '{tmp_path / 'missing'}' has no readable config.json")
    assert "Traceback" not in out.stderr


def test_environment_and_token_file_are_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    monkeypatch.setenv("KVPOOL_LIMIT_BYTES", "512Mi")
    s = parse_settings(["--admin-token-file", str(token)])
    assert (s.limit_bytes, s.admin_token_source().current()) == (512 << 20, "s3cret")


def test_a_rotated_token_file_is_read_again_and_an_emptied_one_keeps_the_last(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first")
    source = parse_settings(["--admin-token-file", str(token)]).admin_token_source()
    assert source.current() == "first"
    # as the kubelet rotates a mounted Secret: a new file renamed over the old one
    (tmp_path / "new").write_text("second\n")
    os.replace(tmp_path / "new", token)
    assert source.current() == "second"
    token.write_text("")  # half-written: authentication must not switch off
    assert source.current() == "second"
    token.unlink()
    assert source.current() == "second"


def test_an_empty_token_file_is_refused_at_start(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("\n")
    with pytest.raises(SystemExit, match=r"admin-token-file .* is empty"):
        parse_settings(["--admin-token-file", str(tmp_path / "token")])


def test_vllm_gets_the_connector_and_the_virtual_block_count(tiny_model: Path) -> None:
    s = parse_settings(["--model", str(tiny_model), "--limit-bytes", "64Mi", "--virtual-bytes", "1Gi"])
    argv = vllm_argv(s, pool_config(s, str(tiny_model)))
    assert argv[argv.index("--num-gpu-blocks-override") + 1] == str((1 << 30) // (64 << 10))
    assert "kvpool.vllm.engine.connector" in argv[argv.index("--kv-transfer-config") + 1]


def test_preemption_on_shrink_reaches_the_engine_and_null_turns_it_off(tiny_model: Path) -> None:
    import json

    for flags, after in (([], 0.5), (["--preempt-after-s", "2"], 2.0), (["--preempt-after-s", "null"], None)):
        s = parse_settings(["--model", str(tiny_model), *flags])
        argv = vllm_argv(s, pool_config(s, str(tiny_model)))
        connector = json.loads(argv[argv.index("--kv-transfer-config") + 1])["kv_connector_extra_config"]
        assert connector["kvpool"]["preempt_after_s"] == after
        assert ("--scheduler-cls" in argv) == (after is not None)


def test_the_cpu_tier_flag_reaches_vllms_offloading_connector(tiny_model: Path, tmp_path: Path) -> None:
    s = parse_settings(["--model", str(tiny_model), "--offload-bytes", "1Gi", "--offload-dir", str(tmp_path)])
    argv = vllm_argv(s, pool_config(s, str(tiny_model)))
    transfer = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    extra = transfer["kv_connector_extra_config"]
    assert (extra["cpu_bytes_to_use"], extra["spec_name"], extra["kvpool"]["offload_dir"]) == (
        1 << 30,
        "KVPoolOffloadingSpec",
        str(tmp_path),
    )
    assert transfer["kv_load_failure_policy"] == "recompute"


def test_the_engine_reserves_the_cores_stock_vllm_reserves(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_CPU_NUM_OF_RESERVED_CPU", raising=False)
    s = parse_settings(["--model", str(tiny_model), "--tensor-parallel-size", "2"])
    assert pool_config(s, str(tiny_model)).env()["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "2"  # one per rank, as stock
    monkeypatch.setenv("VLLM_CPU_NUM_OF_RESERVED_CPU", "3")  # the user's own choice is kept
    assert "VLLM_CPU_NUM_OF_RESERVED_CPU" not in pool_config(s, str(tiny_model)).env()


def test_the_servers_offload_policies_are_the_connectors() -> None:
    """One list: the flag offers exactly what the connector accepts."""
    from typing import get_args

    from kvpool.vllm.engine.settings import OFFLOAD_POLICIES

    assert get_args(ServerSettings.model_fields["offload_policy"].annotation) == OFFLOAD_POLICIES


def test_every_pool_option_of_the_engine_config_is_a_server_option_described_where_it_is_defined() -> None:
    """One field set: a new PoolEngineConfig field cannot be forgotten by the server, and the
    server's --help says what the engine config's docstring says."""
    from dataclasses import fields

    from kvpool_server.settings import POOL_FIELDS

    from kvpool.docstrings import attribute_docs
    from kvpool.vllm.launch.args import PoolEngineConfig

    internal = {"model", "served_name", "control_address", "grow_ahead_blocks"}  # set by the server itself
    engine = {f.name for f in fields(PoolEngineConfig)} - internal
    server = ServerSettings.model_fields
    assert engine <= set(server), sorted(engine - set(server))
    assert set(POOL_FIELDS) <= engine
    docs = attribute_docs(PoolEngineConfig)
    for name in engine:
        assert (server[name].description or "").startswith(docs[name]), name


@pytest.mark.parametrize(
    ("flags", "eager"),
    [([], True), (["--backend", "cuda"], False), (["--backend", "cuda", "--enforce-eager", "true"], True),
     (["--enforce-eager", "false"], False)],
)  # fmt: skip
def test_eager_mode_is_the_cpus_default_and_cuda_graphs_the_gpus(flags: list[str], eager: bool) -> None:
    """No default that costs against stock vLLM: on a GPU vLLM captures CUDA graphs unless told not to."""
    s = parse_settings(flags)
    assert s.eager is eager


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs (root)")
def test_a_tier_larger_than_its_directory_stops_the_start_naming_the_flags(tmp_path: Path) -> None:
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(tmp_path)], check=True)
    try:
        with pytest.raises(SystemExit, match=r"offload-bytes: the CPU tier needs 67108864 bytes in offload-dir"):
            parse_settings(["--offload-bytes", "64Mi", "--offload-dir", str(tmp_path)])
    finally:
        subprocess.run(["umount", str(tmp_path)], check=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs (root)")
def test_a_dead_workers_tier_file_counts_as_room_and_a_live_ones_does_not(tmp_path: Path) -> None:
    """A pod's /dev/shm outlives a container restart: the killed container's tier file is still in
    it, and the restarted server must start (its worker removes the file before reserving)."""
    from kvpool.offload import HostBlockStore

    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(tmp_path)], check=True)
    try:
        dead = tmp_path / "kvpool-tier-m-7-r0"  # nobody holds it: its worker was killed
        with dead.open("wb") as f:
            os.posix_fallocate(f.fileno(), 0, 768 << 10)
        parse_settings(["--offload-bytes", "512Ki", "--offload-dir", str(tmp_path)])
        dead.unlink()
        live = HostBlockStore(tmp_path / "kvpool-tier-m-8-r0", num_chunks=12, chunk_bytes=64 << 10)
        try:
            with pytest.raises(SystemExit, match=r"offload-bytes: the CPU tier needs 524288 bytes"):
                parse_settings(["--offload-bytes", "512Ki", "--offload-dir", str(tmp_path)])
        finally:
            live.close()
    finally:
        subprocess.run(["umount", str(tmp_path)], check=True)
