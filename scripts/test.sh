#!/usr/bin/env bash
# Run the whole test suite in parallel. pytest's exit code 5 (no tests collected) is a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
python -m pytest -n auto -q "$@"
rc=$?
if [ "$rc" = "5" ]; then echo "no tests were collected: failing" >&2; exit 1; fi
exit "$rc"
