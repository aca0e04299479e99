#!/usr/bin/env bash
# Build the real-harness CPU image fleetbench/tf-cpu:latest: the local base image, TensorFlow 2.15.1 CPU from
# PyPI and git (about 1.6 GB). The upstream tf_cnn_benchmarks is not in it: the bake step clones it (bake.git)
# and commits. Cached by a hash of the build inputs: a warm run only re-tags. Kept local (pull_policy: never).
source "$(dirname "$0")/../../../scripts/lib.sh"

build_pip_image fleetbench/tf-cpu "TensorFlow" "$(cd "$(dirname "$0")" && pwd)"
