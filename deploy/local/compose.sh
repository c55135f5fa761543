#!/usr/bin/env bash
# Run deploy/docker-compose.yml with podman on a machine like this project's development machines and
# CI: no image registry, no systemd, hybrid cgroups, a sandbox that refuses podman's default rlimits.
#
#   bash deploy/local/compose.sh build            # the base image first (cached), then the stack's images
#   bash deploy/local/compose.sh up -d
#   bash deploy/local/compose.sh ps
#   bash deploy/local/compose.sh down -v
#   bash deploy/local/compose.sh podman ps -a     # plain podman with the same flags
#
# Everything below is what this machine needs and a normal Docker host does not (README, "Compose and
# Kubernetes"): on Docker, `docker compose -f deploy/docker-compose.yml up --build` is the whole story.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
DEPLOY="$(dirname "$HERE")"
export GIGACLUSTER_BASE_IMAGE="${GIGACLUSTER_BASE_IMAGE:-localhost/debian-base:bookworm}"

# podman's global flags: crun (Debian's default runtime where installed) refuses cgroups in hybrid
# mode, and with no systemd running the cgroup manager is cgroupfs.
PODMAN_GLOBAL=(--runtime runc --cgroup-manager cgroupfs)
# podman asks for rlimits above what the sandbox allows a container (runc: "error setting rlimits").
ULIMITS="--ulimit nofile=1024:1024 --ulimit nproc=1024:1024"
# Removing a container removes its anonymous volumes too (the Dockerfile's VOLUME in every gigacluster
# container): `docker compose down -v` does, podman-compose's `podman rm` would leave them behind.
# Builds use the host's network (no bridge network; the package mirrors are reached as from the host).
BUILD_ARGS="--network host $ULIMITS"
PODMAN=(podman "${PODMAN_GLOBAL[@]}")
# One service per image the stack builds (tests/compose/test_local_files.py checks it covers them all).
BUILD_SERVICES="chip-0 mosquitto prometheus"

command -v podman >/dev/null || { echo "podman is missing: bash tests/install-deps.sh" >&2; exit 1; }
if [ "${1:-}" = podman ]; then
  shift
  exec "${PODMAN[@]}" "$@"
fi
PODMAN_COMPOSE=(podman-compose)
command -v podman-compose >/dev/null || PODMAN_COMPOSE=(python3 -m podman_compose)
COMPOSE=("${PODMAN_COMPOSE[@]}" \
  --podman-args="${PODMAN_GLOBAL[*]}" \
  --podman-build-args="$BUILD_ARGS" \
  --podman-run-args="$ULIMITS" \
  --podman-rm-args=--volumes \
  -f "$DEPLOY/docker-compose.yml" -f "$DEPLOY/docker-compose.local.yml")
if [ "${1:-}" = build ] && [ $# -eq 1 ]; then
  # The base image first (cached), then each image once: the six gigacluster containers share one
  # image, which podman-compose would otherwise build six times at once.
  PODMAN="${PODMAN[*]}" bash "$HERE/make-base-image.sh"
  exec "${COMPOSE[@]}" build $BUILD_SERVICES
fi
exec "${COMPOSE[@]}" "$@"
