"""tilecore-hip: AMD GPUs (CDNA gfx90a / gfx942 / gfx950, RDNA3 gfx1100) through HIP C++.

Tile ops take the core's lowering: fragments in registers by the core's layout model, ``T.gemm`` on the
MFMA / WMMA units registered as data (``units.py``; HIP has no other fast GEMM, so it registers no GEMM
intrinsic of its own and the core's matrix-unit path is the default), row reductions by lane exchanges
across the profile's wave width, ``T.Pipelined`` copies as ``global_load_lds`` where the profile declares
``async_copy``. HIP C++ comes from the core's SIMT C++ emitter (``codegen.py``), code objects from clang
with no ROCm install (``compiler.py``), launches from hip-python where ROCm and a GPU exist
(``runtime.py``). Without a GPU the backend compiles only (``compile-only``); without clang it reports
``no-toolchain`` with the install hint.
"""
from __future__ import annotations

import functools

from tilecore.plugin import Backend, DeviceInfo, PassSpec, Probe, Target, hookimpl

from .codegen import HIPEmitter
from .compiler import INSTALL_HINT, clang_version, disassemble, find_clang
from .runtime import HIPRuntime, _hip, device_count, device_properties, runtime_version

__version__ = "0.1.0"

ARCHS = ("gfx90a", "gfx942", "gfx950", "gfx1100")
ALIASES = {"mi200": "gfx90a", "mi250": "gfx90a", "mi300": "gfx942", "mi300x": "gfx942", "mi350": "gfx950",
           "mi355x": "gfx950", "rdna3": "gfx1100", "gfx940": "gfx942", "gfx941": "gfx942"}
#: ``hip`` alone on a machine without an AMD GPU (documented in the README)
DEFAULT_ARCH = "gfx942"


@functools.lru_cache(maxsize=1)
def local_arch() -> str:
    """The first GPU's architecture, or gfx942 when there is none (or it is one this plugin does not know)."""
    if device_count() == 0:
        return DEFAULT_ARCH
    arch = device_properties(0).get("arch", "")
    return arch if arch in ARCHS else DEFAULT_ARCH


class HIPBackend(Backend):
    name = "hip"
    plugin_api = "1.13"  # capability_files() / arch_of() from the core's Backend
    distribution = "tilecore-hip"

    def parse_target(self, spec: str):
        arch = self.arch_of(spec, ARCHS, ALIASES, local_arch)
        if arch is None:
            return None
        return Target(backend=self.name, kind="hip", arch=arch, capability_id=f"hip/{arch}")

    def targets(self) -> list:
        return [f"hip:{a}" for a in ARCHS]

    def probe(self) -> Probe:
        try:
            tc = clang_version() if find_clang() else ""
        except Exception:  # noqa: BLE001 - a probe never raises
            tc = ""
        if not tc:
            return Probe("no-toolchain", detail=f"no clang++ with the AMDGPU target: {INSTALL_HINT}")
        try:
            n = device_count()
        except Exception:  # noqa: BLE001
            n = 0
        if n == 0:
            why = ("hip-python finds none" if _hip() is not None else
                   "hip-python, the runtime binding, is not installed (pip install hip-python on a ROCm machine)")
            return Probe("no-device", toolchain=tc, detail=f"no AMD GPU ({why}): kernels compile only, with {tc}")
        devices, caps = [], {}
        for k in range(n):
            p = device_properties(k)
            devices.append(DeviceInfo(p.get("name", "AMD GPU"), k, p))
            if k == 0:
                caps = {"execution.simd_width": p.get("warp_size"),
                        "memory.shared.max_bytes_per_block": p.get("shared_per_block"),
                        "execution.max_threads_per_block": p.get("max_threads_per_block")}
                caps = {key: v for key, v in caps.items() if v}
        return Probe("ok", tuple(devices), caps, toolchain=f"{tc}; {runtime_version()}")

    def passes(self, target) -> list:
        from tilecore.passes.simt import simt_distribute  # compile-time only: loading a kernel needs no passes

        return [PassSpec("before-codegen", simt_distribute, position="before")]

    def matrix_units(self, target) -> list:
        from .units import units

        return units(target)

    def emitter(self, target):
        return HIPEmitter()

    def runtime(self, target):
        return HIPRuntime(target.arch or DEFAULT_ARCH)

    def toolchain_version(self, target) -> str:
        return clang_version()

    def disassemble(self, binary: bytes, target) -> str:
        """The code object's instructions through ``llvm-objdump -d --mcpu=<arch>``."""
        return disassemble(binary, target.arch)


@hookimpl
def tilecore_backends():
    return [HIPBackend()]
