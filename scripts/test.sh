#!/usr/bin/env bash
# Run the whole test suite in parallel. pytest's exit code 5 (no tests collected) is a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
# setup.sh installs NVRTC and cuobjdump, so the CUDA backend's compile-only tests must run, never skip
export TILECORE_CUDA_REQUIRE_TOOLCHAIN="${TILECORE_CUDA_REQUIRE_TOOLCHAIN:-1}"
# the slowest tests are listed at the end of the log, so a CI run that grows shows where (keep the run well under 40 minutes)
python -m pytest -n auto -q --durations=25 "$@"
rc=$?
if [ "$rc" = "5" ]; then echo "no tests were collected: failing" >&2; exit 1; fi
exit "$rc"
