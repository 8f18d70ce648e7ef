#!/bin/sh
# Java 17 runs Spark for rocketq.spark's tests and benchmark (DESIGN.md §10): Debian's
# openjdk-17-jre-headless. Installed once, only when no `java` is on PATH.
set -eu
if command -v java >/dev/null 2>&1; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "java not found and apt-get is unavailable: install a Java 17 runtime so 'java' is on PATH" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then
    SUDO="sudo"
fi
echo "installing Debian's openjdk-17-jre-headless (Java for the Spark data source tests)"
$SUDO apt-get update -qq
# The package's postinst needs the man directory that slim images leave out.
$SUDO mkdir -p /usr/share/man/man1
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    openjdk-17-jre-headless >/dev/null
command -v java >/dev/null 2>&1
