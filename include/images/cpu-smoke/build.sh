#!/usr/bin/env bash
# Build the CPU smoke benchmark image and push it to the local registry, so the pipeline's
# pull step pulls for real. Cached by a hash of the build inputs: a warm run only re-tags.
source "$(dirname "$0")/../../../scripts/lib.sh"

HERE="$(cd "$(dirname "$0")" && pwd)"
REGISTRY="${FLEETBENCH_REGISTRY:-127.0.0.1:5000}"
NAME="fleetbench/cpu-smoke"
BASE="${FLEETBENCH_BASE_IMAGE:-fleetbench/base:bookworm}"

bash "$HERE/../base/build.sh"
base_id="$(docker image inspect -f '{{.Id}}' "$BASE")"
inputs_hash="$( (echo "$base_id"; cat "$HERE/Dockerfile" "$HERE/tf_cnn_benchmarks.py") | sha256sum | cut -c1-12)"
tag="$NAME:$inputs_hash"

if docker image inspect "$tag" >/dev/null 2>&1; then
  say "smoke image $tag is cached"
else
  say "building $tag"
  DOCKER_BUILDKIT=0 docker build -q --build-arg "BASE=$BASE" \
    --label "org.fleetbench.inputs=$inputs_hash" -t "$tag" "$HERE" >/dev/null 2>"$FB_STATE/smoke-build.log" \
    || { cat "$FB_STATE/smoke-build.log" >&2; die "building the smoke image failed"; }
fi
docker tag "$tag" "$NAME:latest"
docker tag "$tag" "$REGISTRY/$NAME:latest"
docker push -q "$REGISTRY/$NAME:latest" >/dev/null 2>"$FB_STATE/smoke-push.log" \
  || { cat "$FB_STATE/smoke-push.log" >&2; die "pushing $REGISTRY/$NAME:latest failed (is the registry up? scripts/ensure-registry.sh)"; }
say "smoke image pushed: $REGISTRY/$NAME:latest"
