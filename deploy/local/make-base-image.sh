#!/usr/bin/env bash
# Make the Debian base image the local compose stack builds on, where no image registry is reachable:
# debootstrap a minimal Debian (bookworm, minbase) from the Debian package mirror apt already uses and
# import it into podman as localhost/debian-base:bookworm. Cached: an image already in podman's
# storage is kept (FORCE=1 remakes it). A machine that can pull images does not need this: the
# Dockerfile's default base is the official python image. Needs root (debootstrap) and podman.
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"  # debootstrap lives in /usr/sbin
IMAGE="${GIGACLUSTER_BASE_IMAGE:-localhost/debian-base:bookworm}"
SUITE="${DEBIAN_SUITE:-bookworm}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PODMAN="${PODMAN:-podman}"

if [ "${FORCE:-0}" != 1 ] && $PODMAN image exists "$IMAGE"; then
  echo "base image $IMAGE: cached"
  exit 0
fi
command -v debootstrap >/dev/null || { echo "debootstrap is missing: apt-get install debootstrap" >&2; exit 1; }
ROOTFS="$(mktemp -d /var/tmp/gigacluster-rootfs.XXXXXX)"
trap 'rm -rf "$ROOTFS"' EXIT
start=$(date +%s)
debootstrap --variant=minbase "$SUITE" "$ROOTFS" "$MIRROR" >"$ROOTFS.log" 2>&1 \
  || { tail -20 "$ROOTFS.log" >&2; rm -f "$ROOTFS.log"; exit 1; }
rm -f "$ROOTFS.log"
# What an image build does not need: downloaded .debs, package lists (a build runs apt-get update).
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/tmp/*
# Trust what this host trusts: its own extra CAs (here, the sandbox's TLS-intercepting egress proxy;
# none on an ordinary machine) go where Debian's ca-certificates picks them up, and pip reads the
# host's bundle until the image installs its own.
changes=(--change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8')
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  mkdir -p "$ROOTFS/usr/local/share/ca-certificates" "$ROOTFS/etc/ssl/certs"
  cp /usr/local/share/ca-certificates/*.crt "$ROOTFS/usr/local/share/ca-certificates/"
  cp /etc/ssl/certs/ca-certificates.crt "$ROOTFS/etc/ssl/certs/ca-certificates.crt"
  changes+=(--change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt')
fi
tar --numeric-owner -C "$ROOTFS" -c . | $PODMAN import --quiet "${changes[@]}" - "$IMAGE" >/dev/null
echo "base image $IMAGE: made in $(( $(date +%s) - start )) s"
