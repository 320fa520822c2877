"""A real Kubernetes API server for tests: etcd + kube-apiserver 1.20 on 127.0.0.1 (the binaries
``make k8s-tools`` builds), TLS with a throwaway CA, an admin (system:masters) client certificate
and a static-token user with no rights until a test binds it some."""

from __future__ import annotations

import os
import ssl
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.server.conftest import free_port

BIN = Path(os.environ.get("KVPOOL_K8S_BIN", Path.home() / ".cache/kvpool-k8s/v1.20.2/bin"))
TOKEN_USER, TOKEN = "kvpool-operator-test", "operator-test-token"


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_pki(d: Path, ips: tuple[str, ...] = ("127.0.0.1",)) -> None:
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{d}/ca.key", "-out", f"{d}/ca.crt",
             "-subj", "/CN=kvpool-test-ca", "-days", "2")  # fmt: skip
    sans = ",".join([*(f"IP:{ip}" for ip in ips), "DNS:localhost", "DNS:kubernetes.default.svc"])
    (d / "san.ext").write_text(f"subjectAltName={sans}\nextendedKeyUsage=serverAuth\n")
    (d / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name, subj, ext in (
        ("server", "/CN=kube-apiserver", "san.ext"),
        ("admin", "/O=system:masters/CN=admin", "client.ext"),
    ):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{d}/{name}.key", "-out", f"{d}/{name}.csr",
                 "-subj", subj)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{d}/{name}.csr", "-CA", f"{d}/ca.crt", "-CAkey", f"{d}/ca.key",
                 "-CAcreateserial", "-out", f"{d}/{name}.crt", "-days", "2", "-extfile", f"{d}/{ext}")  # fmt: skip
    _openssl("genrsa", "-out", f"{d}/sa.key", "2048")
    _openssl("rsa", "-in", f"{d}/sa.key", "-pubout", "-out", f"{d}/sa.pub")
    (d / "tokens.csv").write_text(f'{TOKEN},{TOKEN_USER},1001,""\n')


@dataclass
class Cluster:
    dir: Path
    url: str
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def kubeconfig(self, token: str | None = None) -> Path:
        """A kubeconfig for the admin (client certificate) or for a static-token user."""
        user: dict[str, Any] = (
            {"token": token} if token
            else {"client-certificate": str(self.dir / "admin.crt"), "client-key": str(self.dir / "admin.key")}
        )  # fmt: skip
        ca = self.dir / "ca.crt"
        cfg = {
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "test", "cluster": {"server": self.url, "certificate-authority": str(ca)}}],
            "users": [{"name": "u", "user": user}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "u", "namespace": "default"}}],
        }  # fmt: skip
        path = self.dir / (f"kubeconfig-{'token' if token else 'admin'}")
        path.write_text(yaml.safe_dump(cfg))
        return path

    def stop(self) -> None:
        stop_processes(self.procs)

    def apiserver(self) -> subprocess.Popen[bytes]:
        return next(p for p in self.procs if "kube-apiserver" in str(p.args[0]))  # type: ignore[index]

    def stop_apiserver(self) -> None:
        """Stop kube-apiserver (SIGTERM, as a control-plane upgrade does); etcd keeps the state."""
        stop_processes([self.apiserver()])

    def start_apiserver(self) -> None:
        """Start kube-apiserver again with the same flags, same port; back when it is ready."""
        old = self.apiserver()
        new = subprocess.Popen(old.args, stdout=(self.dir / "apiserver.log").open("ab"), stderr=subprocess.STDOUT)
        self.procs[self.procs.index(old)] = new
        wait_apiserver(self)


def stop_processes(procs: list[subprocess.Popen[bytes]]) -> None:
    """Last started, first stopped: SIGTERM, then SIGKILL after 20 s."""
    for p in reversed(procs):
        p.terminate()
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()


def start_cluster(d: Path, address: str = "127.0.0.1", *, node: bool = False) -> Cluster:
    """``node``: serve a real node too -- service-account tokens admitted into pods (the test API
    server leaves them out), the kubelet reached by its InternalIP, the Service range's first
    address (the in-cluster ``kubernetes`` Service) in the serving certificate."""
    missing = [b for b in ("etcd", "kube-apiserver") if not (BIN / b).exists()]
    if missing:
        raise RuntimeError(f"{missing} not in {BIN}: run `make k8s-tools` (tools/k8s/build.sh) first")
    make_pki(d, (address, "127.0.0.1", "10.96.0.1") if node else (address,))
    etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
    etcd_url = f"http://127.0.0.1:{etcd_port}"
    cluster = Cluster(d, f"https://{address}:{api_port}")
    log = (d / "etcd.log").open("wb")
    cluster.procs.append(subprocess.Popen([
        str(BIN / "etcd"), "--data-dir", str(d / "etcd"), "--listen-client-urls", etcd_url,
        "--advertise-client-urls", etcd_url, "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
        "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
        "--initial-cluster", f"default=http://127.0.0.1:{peer_port}", "--unsafe-no-fsync",
    ], stdout=log, stderr=subprocess.STDOUT))  # fmt: skip
    log = (d / "apiserver.log").open("wb")
    cluster.procs.append(subprocess.Popen([
        str(BIN / "kube-apiserver"), f"--etcd-servers={etcd_url}", f"--bind-address={address}",
        f"--advertise-address={address}", f"--secure-port={api_port}", "--insecure-port=0",
        f"--tls-cert-file={d}/server.crt", f"--tls-private-key-file={d}/server.key", f"--client-ca-file={d}/ca.crt",
        f"--token-auth-file={d}/tokens.csv", "--authorization-mode=RBAC",
        "--service-account-issuer=https://kubernetes.default.svc", f"--service-account-key-file={d}/sa.pub",
        f"--service-account-signing-key-file={d}/sa.key", "--service-cluster-ip-range=10.96.0.0/24",
        *(["--kubelet-preferred-address-types=InternalIP"] if node else
          ["--disable-admission-plugins=ServiceAccount"]),
    ], stdout=log, stderr=subprocess.STDOUT))  # fmt: skip
    wait_apiserver(cluster)
    return cluster


def wait_apiserver(cluster: Cluster) -> None:
    d = cluster.dir
    tls = ssl.create_default_context(cafile=str(d / "ca.crt"))
    tls.load_cert_chain(str(d / "admin.crt"), str(d / "admin.key"))
    client = httpx.Client(verify=tls, timeout=5)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if client.get(cluster.url + "/readyz").text == "ok":
                return
        except httpx.HTTPError:
            pass
        if any(p.poll() is not None for p in cluster.procs):
            break
        time.sleep(0.5)
    cluster.stop()
    raise RuntimeError("kube-apiserver did not become ready:\n" + (d / "apiserver.log").read_text()[-3000:])
