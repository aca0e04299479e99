#!/usr/bin/env bash
# Build the torch_synthetic CPU image fleetbench/torch-cpu:latest: the local base image, PyTorch and
# torchvision from PyPI, the project's training loop. Cached by a hash of the build inputs: a warm run only
# re-tags. Kept local (pull_policy: never): the image is several GB (PyPI's x86_64 torch brings its CUDA
# libraries), too big to copy into the test registry for nothing.
source "$(dirname "$0")/../../../scripts/lib.sh"

HERE="$(cd "$(dirname "$0")" && pwd)"
NAME="fleetbench/torch-cpu"
BASE="${FLEETBENCH_BASE_IMAGE:-fleetbench/base:bookworm}"

bash "$HERE/../base/build.sh"
base_id="$(docker image inspect -f '{{.Id}}' "$BASE")"
inputs_hash="$( (echo "$base_id"; cat "$HERE/Dockerfile" "$HERE/torch_synthetic.py") | sha256sum | cut -c1-12)"
tag="$NAME:$inputs_hash"

if docker image inspect "$tag" >/dev/null 2>&1; then
  say "torch image $tag is cached"
else
  say "building $tag (PyTorch from PyPI: a few GB, several minutes the first time on this machine)"
  ctx="$(mktemp -d "${TMPDIR:-/tmp}/fleetbench-torch.XXXXXX")"
  trap 'rm -rf "$ctx"' EXIT
  cp "$HERE/Dockerfile" "$HERE/torch_synthetic.py" "$ctx/"
  # The build machine's CA bundle, for pip behind a TLS-intercepting proxy (else the system's).
  ca="${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}"
  [ -r "$ca" ] || die "no CA bundle at $ca (set PIP_CERT)"
  cp "$ca" "$ctx/ca.crt"
  DOCKER_BUILDKIT=0 docker build -q --network host --build-arg "BASE=$BASE" \
    --label "org.fleetbench.inputs=$inputs_hash" -t "$tag" "$ctx" >/dev/null 2>"$FB_STATE/torch-build.log" \
    || { tail -n 30 "$FB_STATE/torch-build.log" >&2; die "building the torch image failed"; }
fi
docker tag "$tag" "$NAME:latest"
say "torch image ready: $NAME:latest"
