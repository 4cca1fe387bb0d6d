#!/usr/bin/env bash
# Run the whole test suite in parallel. pytest's exit code 5 (no tests collected) is a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
# setup.sh installs NVRTC and cuobjdump, so the CUDA backend's compile-only tests must run, never skip
export TILECORE_CUDA_REQUIRE_TOOLCHAIN="${TILECORE_CUDA_REQUIRE_TOOLCHAIN:-1}"
python -m pytest -n auto -q "$@"
rc=$?
if [ "$rc" = "5" ]; then echo "no tests were collected: failing" >&2; exit 1; fi
exit "$rc"
