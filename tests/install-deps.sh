#!/usr/bin/env bash
# Everything the tests drive that pip does not install, each only when missing (safe to run again):
# Mosquitto and its clients, the Prometheus server and promtool (Debian packages), the buf CLI and
# a Node gRPC client (npm, pinned, in the prefixes tests/ops/buftool.py searches), and for the compose
# step podman with runc and debootstrap (Debian packages; podman-compose is in the dev extra). Needs root or sudo
# for apt-get. The README's test command and .ci/run both run it.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

BUF_VERSION=1.75.0
BUF_DIR="${BUF_DIR:-/tmp/gigacluster-buf-$BUF_VERSION}"
NODE_CLIENT_DIR=/tmp/gigacluster-grpc-node
NODE_CLIENT_PACKAGES=(@grpc/grpc-js@1.14.7 @grpc/proto-loader@0.8.1)

missing=()
command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ] || missing+=(mosquitto)
command -v mosquitto_sub >/dev/null 2>&1 || missing+=(mosquitto-clients)
{ command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; } || missing+=(prometheus)
command -v npm >/dev/null 2>&1 || missing+=(npm)
# The compose step (deploy/local/compose.sh): crun, podman's other runtime, fails on hybrid cgroups.
command -v podman >/dev/null 2>&1 || missing+=(podman)
command -v runc >/dev/null 2>&1 || missing+=(runc)
command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ] || missing+=(debootstrap)
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
  # --no-install-recommends keeps prometheus-node-exporter and friends out
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ ! -x "$BUF_DIR/node_modules/.bin/buf" ]; then
  npm install --silent --no-audit --no-fund --prefix "$BUF_DIR" "@bufbuild/buf@$BUF_VERSION"
fi
if [ ! -d "$NODE_CLIENT_DIR/node_modules/@grpc/proto-loader" ]; then
  npm install --silent --no-audit --no-fund --prefix "$NODE_CLIENT_DIR" "${NODE_CLIENT_PACKAGES[@]}"
fi
