#!/bin/sh
# podman (rootful, with the runc runtime), mmdebstrap and uidmap for the container tests of the
# Kubernetes deployment (DESIGN.md §9): the image is built from a base made of Debian packages, so
# no container registry is needed. Installed once, only when missing.
set -eu
missing=""
command -v podman >/dev/null 2>&1 || missing="$missing podman"
command -v runc >/dev/null 2>&1 || missing="$missing runc"
command -v mmdebstrap >/dev/null 2>&1 || missing="$missing mmdebstrap"
# netavark (podman's network stack) sets up container networks with iptables
command -v iptables >/dev/null 2>&1 || missing="$missing iptables"
if [ -z "$missing" ]; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "missing:$missing and apt-get is unavailable: install podman, runc, mmdebstrap and iptables" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then
    SUDO="sudo"
fi
echo "installing Debian's podman, runc and mmdebstrap (container image tests)"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    podman runc mmdebstrap iptables netavark aardvark-dns uidmap slirp4netns fuse-overlayfs >/dev/null
command -v podman >/dev/null 2>&1 && command -v runc >/dev/null 2>&1 && command -v mmdebstrap >/dev/null 2>&1
