#!/usr/bin/env bash
# Build the local base image fleetbench/base:bookworm (Debian bookworm minbase + python3 + numpy)
# with debootstrap -> docker import, because no public registry can be assumed reachable.
# Cached by its inputs (this script): a tag <repository>:inputs-<digest of this file> marks the image built from them;
# an image built from other inputs is rebuilt (the images built on it then are too: their hashes name its id).
# An image from before these marks (no inputs-* tag in its repository) is adopted once. FORCE=1 rebuilds.
source "$(dirname "$0")/../../../scripts/lib.sh"

IMAGE="${FLEETBENCH_BASE_IMAGE:-fleetbench/base:bookworm}"
REPO="${IMAGE%:*}"
MARK="$REPO:inputs-$(sha256sum "$0" | cut -c1-12)"
if [ "${FORCE:-0}" != 1 ] && docker image inspect "$IMAGE" >/dev/null 2>&1; then
  id="$(docker image inspect -f '{{.Id}}' "$IMAGE")"
  if [ "$(docker image inspect -f '{{.Id}}' "$MARK" 2>/dev/null)" = "$id" ]; then
    say "base image $IMAGE is cached"
    exit 0
  fi
  tags="$(docker images --format '{{.Tag}}' "$REPO")"  # read whole: grep -q closing a pipe early fails it (pipefail)
  if ! grep -q '^inputs-' <<<"$tags"; then
    docker tag "$IMAGE" "$MARK"
    say "base image $IMAGE is cached (built before its inputs were marked: taken as built from these, $MARK)"
    exit 0
  fi
  say "base image $IMAGE was built from other inputs than this script's: rebuilding"
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
marks="$(docker images --format '{{.Repository}}:{{.Tag}}' "$REPO")"
for old in $(grep ':inputs-' <<<"$marks" | grep -vxF "$MARK" || true); do
  docker rmi "$old" >/dev/null 2>&1 || true  # the marks of earlier builds (their images go with them, if unused)
done
docker tag "$IMAGE" "$MARK"
say "built $IMAGE ($(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1/1e6}'))"
