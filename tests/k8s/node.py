"""A real single-node Kubernetes cluster that runs pods, for the end-to-end tests and
``make cluster``: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and the kubelet
(1.20.2, built from Debian's source by ``make k8s-tools``) over Debian's containerd 1.6 + runc 1.1,
with the CNI bridge plugin. Images come from tarballs (``tools/k8s/images.sh``), imported once
into a containerd store kept in the cache; pods run them with ``imagePullPolicy: IfNotPresent``.

Networking stays on this machine: a bridge of our own (``kvpoolbr0``, 10.244.7.0/24) that every
pod's veth joins. The API server listens on the bridge's gateway address, so pods reach it. There is
no kube-proxy (it would rewrite the host's iptables), so a Service's ClusterIP routes nowhere:
pods that talk to the API server are given its address (``KUBERNETES_SERVICE_HOST``/``PORT``), and
everything else is reached by pod IP -- which is how the operator finds model servers anyway
(EndpointSlices). Needs root (containerd, the kubelet, a bridge).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.k8s.cluster import BIN, Cluster, start_cluster, stop_processes
from tests.server.conftest import free_port

NODE_ROOT = BIN.parent / "node"  # Debian's containerd, runc, CNI plugins, unpacked by make k8s-tools
CACHE = BIN.parents[1]
BRIDGE, GATEWAY, SUBNET = "kvpoolbr0", "10.244.7.1", "10.244.7.0/24"
NODE_NAME = "node1"
PAUSE_IMAGE = "kvpool.local/pause:1.20.2"
NS = "k8s.io"  # containerd's namespace for the CRI


@dataclass
class NodeCluster:
    """The control plane (``api``) and the node's processes, stopped in reverse order."""

    api: Cluster
    dir: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    before: frozenset[Path] = field(default_factory=lambda: _host_state())  # what the sweep must not touch

    @property
    def sock(self) -> Path:
        return self.dir / "containerd" / "containerd.sock"

    def kubectl(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        cmd = [str(BIN / "kubectl"), "--kubeconfig", str(self.api.kubeconfig()), *args]
        return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=timeout)

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", "-o", "json", *args).stdout)

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [str(NODE_ROOT / "usr/bin/ctr"), "--address", str(self.sock), "-n", NS, *args]
        return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=600)

    def logs(self) -> str:
        """The tails of every component's log, for a failure message."""
        out = []
        for log in sorted(self.dir.glob("*.log")) + sorted(self.api.dir.glob("*.log")):
            out.append(f"--- {log.name}\n" + log.read_text(errors="replace")[-2000:])
        return "\n".join(out)

    def leftovers(self) -> list[str]:
        """What a stopped node still holds on the host (empty after a clean :meth:`stop`)."""
        tasks = self.dir / "containerd" / "state" / "io.containerd.runtime.v2.task" / NS
        ids = [t.name for t in tasks.iterdir()] if tasks.is_dir() else []
        out = [f"process {pid} of container {i[:12]}" for i in ids for pid in _cgroup_tasks(i)]
        out += [f"process {pid}: {self.dir} in its command line" for pid in _pids_matching(str(self.dir))]
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
        out += [f"mount {m}" for m in mounts if m.startswith(str(self.dir))]
        out += [f"host path {p}" for p in _host_state() - self.before]
        if _run("ip", "link", "show", BRIDGE, check=False).returncode == 0:
            out.append(f"bridge {BRIDGE}")
        return out

    def _delete_pods(self) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.kubectl("delete", "deployments,replicasets,daemonsets,statefulsets,jobs", "--all",
                         "--all-namespaces", "--wait=true", check=False, timeout=60)  # fmt: skip
            self.kubectl("delete", "pods", "--all", "--all-namespaces", "--grace-period=1", "--wait=true",
                         check=False, timeout=90)  # fmt: skip

    def stop(self) -> None:
        """Pods first, through the kubelet (it stops containers and tears their networks down) --
        their controllers before them, or they come back -- then every process; then whatever a
        crash left: processes, mounts, network namespaces, pod logs, cgroups, the bridge."""
        if any(str(p.args[0]).endswith("kubelet") and p.poll() is None for p in self.procs):  # type: ignore[index]
            self._delete_pods()  # without a kubelet nothing would stop them: the sweep does
        stop_processes(self.procs)
        self.api.stop()
        _sweep(self.dir)
        _sweep_host(self.before)


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), capture_output=True, text=True, check=check)


def _bridge() -> None:
    """The pods' bridge with the gateway address, before the API server binds to that address (the
    CNI bridge plugin adopts an existing bridge)."""
    if _run("ip", "link", "show", BRIDGE, check=False).returncode != 0:
        _run("ip", "link", "add", BRIDGE, "type", "bridge")
    if GATEWAY not in _run("ip", "-br", "addr", "show", BRIDGE).stdout:
        _run("ip", "addr", "add", f"{GATEWAY}/24", "dev", BRIDGE)
    _run("ip", "link", "set", BRIDGE, "up")


def _sweep(d: Path) -> None:
    """Leftovers of a run that did not end cleanly: containers' processes (found by the cgroup runc
    made for each container of this node's containerd), shims, mounts under ``d``, the bridge.
    The containers go first: a killed shim leaves its container running, orphaned."""
    tasks = d / "containerd" / "state" / "io.containerd.runtime.v2.task" / NS
    ids = [t.name for t in tasks.iterdir()] if tasks.is_dir() else []
    for pid in {pid for i in ids for pid in _cgroup_tasks(i)}:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
    deadline = time.monotonic() + 10
    while any(_cgroup_tasks(i) for i in ids) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in _pids_matching(str(d)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for m in sorted((m for m in mounts if m.startswith(str(d))), key=len, reverse=True):
        _run("umount", "-l", m, check=False)
    _run("ip", "link", "del", BRIDGE, check=False)


# What a node leaves on the host outside its own directory; what was there before it started stays.
_HOST_DIRS = (Path("/var/run/netns"), Path("/var/log/pods"), Path("/var/log/containers"))


def _host_state() -> frozenset[Path]:
    return frozenset(p for d in _HOST_DIRS if d.is_dir() for p in d.iterdir())


def _sweep_host(before: frozenset[Path]) -> None:
    for path in _host_state() - before:
        if path.parent.name == "netns":
            _run("ip", "netns", "del", path.name, check=False)
        elif path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    for cgroup in Path("/sys/fs/cgroup").glob("*/k8s.io"):  # containerd's parent: empty once its tasks end
        for d in sorted((p for p in cgroup.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                d.rmdir()
        with contextlib.suppress(OSError):
            cgroup.rmdir()


def _cgroup_tasks(container: str) -> set[int]:
    """The processes in a container's cgroups (containerd's CRI parent is ``k8s.io``, cgroupfs)."""
    out: set[int] = set()
    for f in Path("/sys/fs/cgroup").glob(f"*/{NS}/{container}/cgroup.procs"):
        with contextlib.suppress(OSError):
            out |= {int(p) for p in f.read_text().split()}
    return out


def _pids_matching(text: str) -> list[int]:
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                if text in (proc / "cmdline").read_bytes().decode(errors="replace"):
                    out.append(int(proc.name))
            except OSError:
                continue
    return out


def _containerd_config(d: Path) -> Path:
    cni = d / "cni"
    cni.mkdir(parents=True, exist_ok=True)
    (cni / "10-kvpool.conflist").write_text(json.dumps({
        "cniVersion": "0.4.0", "name": "kvpool",
        "plugins": [
            {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False, "hairpinMode": True,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": SUBNET, "gateway": GATEWAY}]],
                      "dataDir": str(d / "cni-ipam")}},
            {"type": "loopback"},
        ],
    }))  # fmt: skip
    root = CACHE / "containerd"  # images stay imported across sessions (a 3 GB image once)
    config = d / "containerd.toml"
    config.write_text(f"""version = 2
root = "{root}"
state = "{d / "containerd" / "state"}"
[grpc]
  address = "{d / "containerd" / "containerd.sock"}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # this VM does not let root lower oom_score_adj: without this, every sandbox fails in runc
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "{NODE_ROOT / "usr/sbin/runc"}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{NODE_ROOT / "usr/lib/cni"}"
    conf_dir = "{cni}"
""")
    return config


def _spawn(nc: NodeCluster, name: str, cmd: list[str], env: dict[str, str] | None = None) -> None:
    log = (nc.dir / f"{name}.log").open("wb")
    nc.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env))


def _wait(what: str, ok: Any, nc: NodeCluster, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ok():
            return
        dead = [p.args for p in nc.procs if p.poll() is not None]
        if dead:
            raise RuntimeError(f"{what}: a process exited: {dead}\n{nc.logs()}")
        time.sleep(0.5)
    raise RuntimeError(f"{what}: not within {timeout:.0f} s\n{nc.logs()}")


def _control_plane(nc: NodeCluster) -> None:
    d, kubeconfig = nc.api.dir, str(nc.api.kubeconfig())
    _spawn(nc, "controller-manager", [
        str(BIN / "kube-controller-manager"), f"--kubeconfig={kubeconfig}", "--leader-elect=false",
        "--secure-port=0", "--port=0", "--controllers=*,-nodeipam,-csrsigning,-csrapproving",
        f"--service-account-private-key-file={d}/sa.key", f"--root-ca-file={d}/ca.crt",
        "--use-service-account-credentials=false", "--node-monitor-grace-period=20s",
    ])  # fmt: skip
    _spawn(nc, "scheduler", [
        str(BIN / "kube-scheduler"), f"--kubeconfig={kubeconfig}", "--leader-elect=false",
        "--secure-port=0", "--port=0",
    ])  # fmt: skip


def _containerd(nc: NodeCluster) -> None:
    env = os.environ | {"PATH": f"{NODE_ROOT / 'usr/bin'}:{NODE_ROOT / 'usr/sbin'}:{os.environ['PATH']}"}
    _spawn(nc, "containerd", [str(NODE_ROOT / "usr/bin/containerd"), "--config", str(_containerd_config(nc.dir))],
           env)  # fmt: skip
    _wait("containerd", lambda: nc.sock.exists() and nc.ctr("version", check=False).returncode == 0, nc, 30)


def import_images(nc: NodeCluster, tarballs: list[Path]) -> None:
    """Import each tarball once: a marker named after it records that its image is in the store."""
    for tar in tarballs:
        marker = CACHE / "containerd" / f"imported-{tar.name}"
        if not marker.exists():
            nc.ctr("images", "import", str(tar))
            marker.touch()


def _kubelet(nc: NodeCluster) -> None:
    d = nc.dir / "kubelet"
    d.mkdir()
    _spawn(nc, "kubelet", [
        str(BIN / "kubelet"), f"--kubeconfig={nc.api.kubeconfig()}", "--container-runtime=remote",
        f"--container-runtime-endpoint=unix://{nc.sock}", "--cgroup-driver=cgroupfs", "--fail-swap-on=false",
        "--cgroups-per-qos=false", "--enforce-node-allocatable=", "--eviction-hard=",
        "--image-gc-high-threshold=100", "--image-gc-low-threshold=99", "--authentication-token-webhook=false",
        "--authorization-mode=AlwaysAllow", "--read-only-port=0", f"--address={GATEWAY}", f"--node-ip={GATEWAY}",
        f"--port={free_port()}", f"--root-dir={d}", f"--cert-dir={d / 'pki'}", f"--hostname-override={NODE_NAME}",
        f"--pod-infra-container-image={PAUSE_IMAGE}", f"--volume-plugin-dir={d / 'plugins'}",
        "--node-status-update-frequency=4s", "--serialize-image-pulls=false",
    ])  # fmt: skip


def _node_ready(nc: NodeCluster) -> bool:
    out = nc.kubectl("get", "node", NODE_NAME, "-o", "json", check=False)
    if out.returncode != 0:
        return False
    conditions = json.loads(out.stdout)["status"].get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def start_node_cluster(d: Path, images: list[Path]) -> NodeCluster:
    """The whole cluster, its node Ready and ``images`` in the node's image store."""
    if os.geteuid() != 0:
        raise RuntimeError("a node needs root: containerd, the kubelet and a bridge")
    missing = [p for p in (BIN / "kubelet", NODE_ROOT / "usr/bin/containerd") if not p.exists()]
    if missing:
        raise RuntimeError(f"{missing} missing: run `make k8s-tools` (tools/k8s/build.sh) first")
    _sweep(d)
    (d / "api").mkdir(parents=True, exist_ok=True)
    _bridge()
    nc = NodeCluster(start_cluster(d / "api", GATEWAY, node=True), d)
    try:
        _control_plane(nc)
        _containerd(nc)
        import_images(nc, images)
        _kubelet(nc)
        _wait("node Ready", lambda: _node_ready(nc), nc, 120)
    except BaseException:
        nc.stop()
        raise
    return nc


def pod_logs(nc: NodeCluster, namespace: str, selector: str) -> str:
    """What the pods' containers wrote (through the API server and the kubelet, as a user reads them)."""
    out = nc.kubectl("logs", "-n", namespace, "-l", selector, "--all-containers", "--tail=200",
                     "--prefix", check=False)  # fmt: skip
    return out.stdout + out.stderr


def remove_store() -> None:
    """Forget the imported images (``make clean-cluster``)."""
    shutil.rmtree(CACHE / "containerd", ignore_errors=True)


def build_images() -> list[Path]:
    """The pause, operator and cpu images from the Dockerfile (``tools/k8s/images.sh``: cached by
    the hash of what goes into each; a cold build takes minutes)."""
    script = Path(__file__).parents[2] / "tools" / "k8s" / "images.sh"
    env = os.environ | {"KVPOOL_K8S_CACHE": str(CACHE)}
    out = subprocess.run([str(script)], capture_output=True, text=True, env=env, timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"tools/k8s/images.sh failed:\n{out.stderr[-4000:]}")
    return [Path(line) for line in out.stdout.split()]
