#!/bin/sh
# etcd is the consensus store of automatic failover (DESIGN.md §6): Debian's etcd-server package.
# Installed once, only when missing; tests start their own etcd processes on loopback ports.
set -eu
if command -v etcd >/dev/null 2>&1 || [ -x /usr/bin/etcd ]; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "etcd not found and apt-get is unavailable: install etcd (v3.4+) so 'etcd' is on PATH" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then
    SUDO="sudo"
fi
echo "installing Debian's etcd-server (etcd for automatic failover tests)"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends etcd-server >/dev/null
# The package may start a system-wide etcd on 2379; RocketQ's tests use their own ports.
command -v etcd >/dev/null 2>&1 || [ -x /usr/bin/etcd ]
