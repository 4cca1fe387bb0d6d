"""D60's diagnostic: the SASS of the benchmark's exact causal FlashAttention kernel (b8 h32 s4096 d128, 128 x 128)
under NVRTC flags added to the exact build, as this machine's toolchain compiles it: instructions a thread and
iteration of the main loop (tests/sass_paths.py), MUFU.RCP and CALL in the whole kernel. Shows that the flags a
device step passes through ``tilecore.extra_flags`` took effect there.

    python scripts/exp2_flags_sass.py
"""
from __future__ import annotations

import collections
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import tilecore  # noqa: E402
import tilecore_cuda  # noqa: E402

import sass_paths  # noqa: E402
from test_cuda_hopper import HOPPER, _attention  # noqa: E402

ROWS = {"exact": {}, "exact, row_division off": {"tilecore.cuda.row_division": False}, "+ftz": {"tilecore.extra_flags": ["--ftz=true"]},
        "+fmad": {"tilecore.extra_flags": ["--fmad=true"]},
        "+ftz+fmad": {"tilecore.extra_flags": ["--ftz=true", "--fmad=true"]},
        "+prec-div=false": {"tilecore.extra_flags": ["--prec-div=false"]},
        "+all four": {"tilecore.extra_flags": ["--ftz=true", "--fmad=true", "--prec-div=false", "--prec-sqrt=false"]},
        "fast math": {"tilecore.fast_math": True}}


def main() -> int:
    for name, cfg in ROWS.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            k = tilecore.compile(_attention(4096, 128, 128, 128, 256, True, heads=32, batch=8), target=HOPPER,
                                 pass_configs={"tilecore.disable_cache": True, **cfg})
        sass = tilecore_cuda.CUDABackend().disassemble(k.binary, HOPPER)
        ops = collections.Counter(sass_paths.opcode(t) for _, t in sass_paths.parse(sass))
        loop = sass_paths.loop_counts(sass)[0]
        print(f"{name:>16}: main loop {loop['total']} instructions ({loop['MUFU']} MUFU, {loop['FFMA']} FFMA, "
              f"{loop['FMUL']} FMUL, {loop['FSETP']} FSETP), kernel {sum(ops.values())}, MUFU.RCP "
              f"{sass.count('MUFU.RCP')}, CALL {ops['CALL']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
