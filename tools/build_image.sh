#!/bin/sh
# Build the RocketQ container image with podman (DESIGN.md §9), without any container registry:
#   1. the base image (Debian bookworm minbase + python3) from Debian packages with mmdebstrap,
#      imported with `podman import` — only when it is not there yet;
#   2. a wheelhouse of RocketQ and its dependencies built on this machine with pip (so the image
#      build needs no network nor the machine's CA bundle); the dependencies' wheels are the
#      same bytes from build to build, so podman reuses the layer that installs them;
#   3. `podman build` of the multi-stage Containerfile on that base.
# Usage: tools/build_image.sh [IMAGE]   (default localhost/rocketq:dev)
# BASE_IMAGE=... uses another base (e.g. docker.io/library/python:3.11-slim where a registry is
# reachable) and skips step 1.
set -eu
IMAGE="${1:-localhost/rocketq:dev}"
DEFAULT_BASE="localhost/rocketq-base:bookworm"
BASE_IMAGE="${BASE_IMAGE:-$DEFAULT_BASE}"
PY="${PY:-.venv/bin/python}"
# podman on this kind of host needs runc and raised limits (crun fails on its cgroup layout).
PODMAN="podman --runtime runc --network-backend netavark"
cd "$(dirname "$0")/.."

if [ "$BASE_IMAGE" = "$DEFAULT_BASE" ] && ! $PODMAN image exists "$BASE_IMAGE"; then
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    echo "building $BASE_IMAGE from Debian packages (mmdebstrap)"
    sources=/etc/apt/sources.list.d/debian.sources
    [ -f "$sources" ] || sources=http://deb.debian.org/debian
    mmdebstrap --quiet --variant=minbase --include=python3,python3-venv \
        --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
        bookworm "$tmp/base.tar" "$sources"
    $PODMAN import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["/bin/sh"]' "$tmp/base.tar" "$BASE_IMAGE" >/dev/null
fi

echo "building the wheelhouse (build/wheels: dependencies, build/app: rocketq)"
rm -rf build/wheels build/app
mkdir -p build/app
# no build isolation: the project venv has setuptools, and an isolated build env costs seconds
"$PY" -m pip wheel --quiet --no-build-isolation --wheel-dir build/wheels . 2>&1 \
    | grep -v "^WARNING: Location" || true
mv build/wheels/rocketq-*.whl build/app/

echo "building $IMAGE on $BASE_IMAGE"
$PODMAN build --quiet --network none --ulimit nofile=20000:20000 --ulimit nproc=32768:32768 \
    --build-arg BASE_IMAGE="$BASE_IMAGE" -t "$IMAGE" -f Containerfile . >/dev/null
echo "built $IMAGE"
