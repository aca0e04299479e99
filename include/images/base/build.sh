#!/usr/bin/env bash
# Build the local base image fleetbench/base:bookworm (Debian bookworm minbase + python3 + numpy)
# with debootstrap -> docker import, because no public registry can be assumed reachable.
# Cached: does nothing when the image already exists (FORCE=1 rebuilds).
source "$(dirname "$0")/../../../scripts/lib.sh"

IMAGE="${FLEETBENCH_BASE_IMAGE:-fleetbench/base:bookworm}"
if [ "${FORCE:-0}" != 1 ] && docker image inspect "$IMAGE" >/dev/null 2>&1; then
  say "base image $IMAGE is cached"
  exit 0
fi
apt_install debootstrap
work="$(mktemp -d "${TMPDIR:-/tmp}/fleetbench-base.XXXXXX")"
trap 'rm -rf "$work"' EXIT
say "debootstrap bookworm into $work (about a minute)"
debootstrap --variant=minbase --include=python3-minimal,python3-numpy bookworm "$work/rootfs" >"$work/debootstrap.log" 2>&1 \
  || { tail -n 20 "$work/debootstrap.log" >&2; die "debootstrap failed (log above)"; }
rm -rf "$work/rootfs/var/cache/apt/archives/"*.deb "$work/rootfs/var/lib/apt/lists/"*
say "importing rootfs as $IMAGE"
tar -C "$work/rootfs" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'LABEL org.fleetbench.managed=true org.fleetbench.kind=base' \
  --change 'CMD ["python3"]' \
  - "$IMAGE" >/dev/null
say "built $IMAGE ($(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1/1e6}'))"
