"""A test backend with a made-up matrix unit that is not CUDA-like (tests only).

``fakemu``: the CUDA backend's emitter and capability profile, except that its only matrix unit is an
invented ``16x16x8`` instruction run by groups of **64** threads, with its own register order:

- C (16x16, 4 float32 per lane): lane ``l`` holds column ``l % 16``, rows ``4 (l / 16) .. + 3`` in its
  registers 0..3 (a column's 4 consecutive rows in one lane; lanes along columns);
- A (16x8, 2 16-bit elements per lane): row ``l % 16``, columns ``2 (l / 16)`` and ``+ 1``;
- B (8x16, 2 elements): row (k) ``l % 4 + 4 r`` for register ``r``, column ``l / 4``.

Its MatrixOp is spelled ``tc_fakemu_16x16x8(c, a, b)``, which no device has: the generated source runs
on the host through tests/cuda_host_emulator.py, whose shim defines it from this description (every lane
deposits its registers, a group barrier, every lane computes its outputs from the whole A and B). So GEMM
through the core model (tilecore.passes.matrix) is checked on a unit whose layouts share nothing with
mma.sync: a wrong lane or register mapping anywhere gives wrong numbers.
"""
from __future__ import annotations

from tilecore.layout import FragmentLayout, MatrixUnit

SPELLING = "fakemu_16x16x8"
GROUP = 64


def fake_unit() -> MatrixUnit:
    c = FragmentLayout((16, 16), [[("reg", 4, 1), ("thread", 4, 16)], [("thread", 16, 1)]], name="fakemu.C")
    a = FragmentLayout((16, 8), [[("thread", 16, 1)], [("reg", 2, 1), ("thread", 4, 16)]], name="fakemu.A")
    b = FragmentLayout((8, 16), [[("thread", 4, 1), ("reg", 2, 1)], [("thread", 16, 4)]], name="fakemu.B")
    return MatrixUnit("fakemu", 16, 16, 8, ("float16",), "float32", GROUP, a, b, c, SPELLING)


def backend_class():
    """The backend class (imported lazily: it needs the CUDA plugin on the path)."""
    from tilecore.plugin import Probe, Runtime, Target
    from tilecore_cuda import CUDABackend
    from tilecore_cuda.codegen import CUDAEmitter

    class FakeMatrixEmitter(CUDAEmitter):
        matrix_ops = {SPELLING: "tc_fakemu_16x16x8(&{c}[{c_off}], &{a}[{a_off}], &{b}[{b_off}]);"}

    class HostOnlyRuntime(Runtime):
        """No device has the made-up unit: the "binary" is the source, run by tests/cuda_host_emulator.py."""

        def build(self, source, options):
            return source.code.encode()

        def load(self, binary, source):
            raise RuntimeError("fakemu kernels run only on the host emulator (tests/cuda_host_emulator.py)")

        def mode(self):
            return "codegen-only"

    class FakeMatrixBackend(CUDABackend):
        name = "fakemu"
        plugin_api = "1.1"
        distribution = "tilecore-fakemu"

        def parse_target(self, spec):
            return Target("fakemu", "fakemu", "sm_80", (), "fakemu/x1") if spec == "fakemu" else None

        def targets(self):
            return ["fakemu"]

        def capability_files(self):
            return [CAPS_PATH]

        def passes(self, target):  # the core's path only: none of the CUDA register programs
            from tilecore.passes.simt import simt_distribute
            from tilecore.plugin import PassSpec
            from tilecore_cuda.intrinsics import mark_block_threads

            return [PassSpec("tile-lowering", mark_block_threads, position="before"),
                    PassSpec("before-codegen", simt_distribute, position="before")]

        def intrinsics(self, target):
            return []

        def matrix_units(self, target):
            return [fake_unit()]

        def emitter(self, target):
            return FakeMatrixEmitter()

        def runtime(self, target):
            return HostOnlyRuntime()

        def probe(self):
            return Probe("no-device", detail="a made-up matrix unit: kernels run on the host emulator")

    return FakeMatrixBackend


CAPS_PATH = None  # set by register()

CAPS = """\
schema: tilecore.capabilities/v1
id: fakemu/x1
extends: [cuda/sm_80]
match: {arch: x1}
description: a made-up matrix unit (tests only)
matrix_units:
  - {family: fakemu, a_dtypes: [float16], acc_dtype: float32, m: 16, n: 16, k: 8}
provenance:
  matrix_units: "tests/fake_matrix_backend.py (invented)"
  sources: ["tilecore test fixture"]
"""


def register(tmp_path):
    """Register the backend in code (like tests/fake_plugins.py); returns the registry record."""
    import sys
    import types

    from tilecore.plugin import get_registry, hookimpl

    global CAPS_PATH
    CAPS_PATH = tmp_path / "fakemu_x1.yaml"
    CAPS_PATH.write_text(CAPS)
    cls = backend_class()
    mod = types.ModuleType("tc_fake_matrix")

    @hookimpl
    def tilecore_backends():
        return [cls()]

    mod.tilecore_backends = tilecore_backends
    sys.modules.setdefault("tc_fake_matrix", mod)
    return get_registry().register(mod, name="fakemu")
