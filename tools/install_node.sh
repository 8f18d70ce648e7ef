#!/bin/sh
# The official RocketMQ 5 Node.js SDK for the gateway's tests (issue 17): Debian's nodejs and npm
# when node or npm is missing, then rocketmq-client-nodejs at the version pinned by the committed
# package.json + package-lock.json, into tests/integration/v2_apps/node/node_modules (gitignored).
# Nothing runs the SDK outside the tests; `npm ci` installs exactly the locked tree.
set -eu
APPS="$(dirname "$0")/../tests/integration/v2_apps/node"
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "node/npm not found and apt-get is unavailable: install Node.js 18+ with npm" >&2
        exit 1
    fi
    SUDO=""
    if [ "$(id -u)" != "0" ]; then
        SUDO="sudo"
    fi
    echo "installing Debian's nodejs and npm (the official Node.js SDK's tests)"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi
cd "$APPS"
# Already installed at the locked version: nothing to do (make setup runs this on every change
# of pyproject.toml).
if [ -f node_modules/.package-lock.json ] && cmp -s package-lock.json node_modules/.rocketq-lock; then
    exit 0
fi
npm ci --no-audit --no-fund --loglevel=error
cp package-lock.json node_modules/.rocketq-lock
