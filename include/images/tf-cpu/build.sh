#!/usr/bin/env bash
# Build the real-harness CPU image fleetbench/tf-cpu:latest: the local base image, TensorFlow 2.15.1 CPU from
# PyPI and git. The upstream tf_cnn_benchmarks is not in it: the bake step clones it (bake.git) and commits.
# Cached by a hash of the build inputs: a warm run only re-tags. Kept local (pull_policy: never).
source "$(dirname "$0")/../../../scripts/lib.sh"

HERE="$(cd "$(dirname "$0")" && pwd)"
NAME="fleetbench/tf-cpu"
BASE="${FLEETBENCH_BASE_IMAGE:-fleetbench/base:bookworm}"

bash "$HERE/../base/build.sh"
base_id="$(docker image inspect -f '{{.Id}}' "$BASE")"
inputs_hash="$( (echo "$base_id"; cat "$HERE/Dockerfile") | sha256sum | cut -c1-12)"
tag="$NAME:$inputs_hash"

if docker image inspect "$tag" >/dev/null 2>&1; then
  say "TensorFlow image $tag is cached"
else
  say "building $tag (TensorFlow 2.15.1 CPU from PyPI: about 1.4 GB, a few minutes the first time on this machine)"
  ctx="$(mktemp -d "${TMPDIR:-/tmp}/fleetbench-tf.XXXXXX")"
  trap 'rm -rf "$ctx"' EXIT
  cp "$HERE/Dockerfile" "$ctx/"
  # The build machine's CA bundle, for pip behind a TLS-intercepting proxy (else the system's).
  ca="${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}"
  [ -r "$ca" ] || die "no CA bundle at $ca (set PIP_CERT)"
  cp "$ca" "$ctx/ca.crt"
  DOCKER_BUILDKIT=0 docker build -q --network host --build-arg "BASE=$BASE" \
    --label "org.fleetbench.inputs=$inputs_hash" -t "$tag" "$ctx" >/dev/null 2>"$FB_STATE/tf-build.log" \
    || { tail -n 30 "$FB_STATE/tf-build.log" >&2; die "building the TensorFlow image failed"; }
fi
docker tag "$tag" "$NAME:latest"
say "TensorFlow image ready: $NAME:latest"
