#!/usr/bin/env bash
# Build the torch_synthetic CPU image fleetbench/torch-cpu:latest: the local base image, PyTorch and
# torchvision from PyPI, the project's training loop. Cached by a hash of the build inputs: a warm run only
# re-tags. Kept local (pull_policy: never): the image is several GB (PyPI's x86_64 torch brings its CUDA
# libraries), too big to copy into the test registry for nothing.
source "$(dirname "$0")/../../../scripts/lib.sh"

build_pip_image fleetbench/torch-cpu "PyTorch" "$(cd "$(dirname "$0")" && pwd)" torch_synthetic.py
