"""tilecore-metal: Apple-silicon GPUs (GPU families Apple7 / Apple8 / Apple9: M1, M2, M3 and M4) through
the Metal Shading Language.

Tile ops take the core's lowering, distributed over the threadgroup by ``tilecore.simt_distribute``:
fragments in registers by the core's layout model, row reductions by ``simd_shuffle_xor`` across the
profile's SIMD width; ``T.gemm`` on ``simdgroup_matrix<T, 8, 8>`` (``intrinsics.py``), registered with the
core as a matrix unit whose layouts are opaque (``units.py``). MSL comes from the core's SIMT C++ emitter
(``codegen.py``), kernels run through PyObjC's Metal framework on macOS (``runtime.py``, mode ``device``).
Elsewhere the backend is ``codegen-only``: the MSL is generated and its bindings checked (``lint.py``);
the plugin's tests compile it with clang against a ``metal_stdlib`` stand-in.

Targets: ``metal:apple7``, ``metal:apple8``, ``metal:apple9`` (aliases ``metal:m1``, ``m2``, ``m3``, ``m4``),
and ``metal`` alone: the local GPU's newest family on a Mac, ``apple7`` elsewhere (the family every
Apple-silicon Mac runs; README).
"""
from __future__ import annotations

import functools
import platform
import sys

from tilecore.plugin import Backend, DeviceInfo, PassSpec, Probe, Target, hookimpl

from .codegen import MetalEmitter
from .runtime import MetalRuntime, default_device, device_family, device_properties, metal_module
from .tensor import MPSTensor, mps  # noqa: F401 - the public way to pass torch mps tensors

__version__ = "0.1.0"

FAMILIES = ("apple7", "apple8", "apple9")
ALIASES = {"m1": "apple7", "m2": "apple8", "m3": "apple9", "m4": "apple9", "a14": "apple7", "a15": "apple8",
           "a16": "apple8", "a17": "apple9"}
#: ``metal`` alone where no Metal device answers: the family every Apple-silicon Mac has (README)
DEFAULT_FAMILY = "apple7"


@functools.lru_cache(maxsize=1)
def local_family() -> str:
    return device_family() or DEFAULT_FAMILY


class MetalBackend(Backend):
    name = "metal"
    plugin_api = "1.13"  # capability_files() / arch_of() from the core's Backend
    distribution = "tilecore-metal"

    def parse_target(self, spec: str):
        fam = self.arch_of(spec, FAMILIES, ALIASES, local_family)
        if fam is None:
            return None
        return Target(backend=self.name, kind="metal", arch=fam, capability_id=f"metal/{fam}")

    def targets(self) -> list:
        return [f"metal:{f}" for f in FAMILIES]

    def probe(self) -> Probe:
        if sys.platform != "darwin":
            return Probe("no-device", toolchain="", detail=f"Metal runs on macOS only (this is {platform.system()}): "
                         "kernels are generated and checked only (codegen-only)")
        if metal_module() is None:
            return Probe("no-device", detail="pyobjc-framework-Metal is not installed "
                                             "(pip install 'tilecore-metal[runtime]')")
        if default_device() is None:
            return Probe("no-device", detail="MTLCreateSystemDefaultDevice() found no GPU")
        p = device_properties()
        caps = {"execution.max_threads_per_block": p.get("max_threads_per_threadgroup"),
                "memory.shared.max_bytes_per_block": p.get("threadgroup_memory")}
        return Probe("ok", (DeviceInfo(p.get("name", "Apple GPU"), 0, p),),
                     {k: v for k, v in caps.items() if v}, toolchain=f"Metal ({platform.mac_ver()[0]})")

    def intrinsics(self, target) -> list:
        from .intrinsics import INTRINSICS

        return list(INTRINSICS)

    def passes(self, target) -> list:
        from tilecore.passes.simt import simt_distribute  # compile-time only: loading a kernel needs no passes

        from .intrinsics import mark_block_threads, resident_accumulators

        return [PassSpec("layout", mark_block_threads, position="before"),
                PassSpec("tile-lowering", resident_accumulators, position="after"),
                PassSpec("before-codegen", simt_distribute, position="before")]

    def matrix_units(self, target) -> list:
        from .units import units

        return units(target)

    def emitter(self, target):
        return MetalEmitter()

    def runtime(self, target):
        return MetalRuntime(target.arch or DEFAULT_FAMILY)

    def toolchain_version(self, target) -> str:
        return f"metal-runtime:{platform.mac_ver()[0] or 'none'}"


@hookimpl
def tilecore_backends():
    return [MetalBackend()]
