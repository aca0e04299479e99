#!/usr/bin/env bash
# `make test`: the whole suite against the real services started by `make test-services`.
# pytest's "no tests collected" (exit 5) counts as a failure.
source "$(dirname "$0")/lib.sh"
cd "$FB_ROOT"
set +e
"$FB_ROOT/.venv/bin/pytest" "$@"
rc=$?
set -e
[ $rc -eq 5 ] && die "pytest collected no tests"
exit $rc
