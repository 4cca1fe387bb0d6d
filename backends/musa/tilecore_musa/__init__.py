"""tilecore-musa: Moore Threads GPUs through MUSA C++ (QY2 = ``musa:mp_22``, PH1 = ``musa:mp_31``).

Tile ops take the core's lowering, plus MUSA's own where the capability profile says (``lower.py``): on
QY2 the 32x32x16 MMA atom of a 128-wide warp as a core matrix unit (``units.py``); on PH1 ``T.copy`` into
shared memory as TME loads completing on ASYNC barrier IDs the backend allocates, ``T.gemm`` as SQMMA on
4-warp squads, ``T.Pipelined`` copies as ``__musa_memcpy_g2s``. MUSA C++ comes from the core's SIMT C++
emitter (``codegen.py``). With ``mcc`` and the MUSA driver (``libmusa``) and a device the kernels run
(``device``); here neither exists, so the backend generates and checks code only (``codegen-only``:
structural checks on every build, and a clang syntax check against a stub header where the tests set one).

Language extensions of TileLang-MUSA, declared through plugin API 1.2 (``op_extensions``):
``T.copy(..., force_async_copy=True)`` and ``T.Kernel(..., producer_threads=N)`` on PH1.
"""
from __future__ import annotations

import functools

from tilecore.plugin import Backend, DeviceInfo, OpExtension, PassSpec, Probe, Target, hookimpl

from .codegen import MUSAEmitter
from .compiler import MCC_HINT, find_clang, find_mcc, mcc_version, stub_dir
from .runtime import MUSARuntime, device_count, device_properties

__version__ = "0.1.0"

ARCHS = ("mp_22", "mp_31")
PROFILES = {"mp_22": "musa/quyuan", "mp_31": "musa/pinghu"}
ALIASES = {"qy2": "mp_22", "quyuan": "mp_22", "s4000": "mp_22", "ph1": "mp_31", "pinghu": "mp_31", "s5000": "mp_31"}
#: ``musa`` alone on a machine without a Moore Threads GPU (documented in the README)
DEFAULT_ARCH = "mp_31"

EXTENSIONS = {
    "force_async_copy": OpExtension(
        "copy", "force_async_copy", "TileLang-MUSA's switch: keep this global->shared copy off TME; in a "
        "T.Pipelined loop it becomes per-thread asynchronous copies (__musa_memcpy_g2s)"),
    "producer_threads": OpExtension(
        "Kernel", "producer_threads", "TileLang-MUSA's producer warp count: the first thread of the last "
        "producer_threads threads issues the kernel's TME loads", types=(int,)),
}


@functools.lru_cache(maxsize=1)
def local_arch() -> str:
    if device_count() == 0:
        return DEFAULT_ARCH
    arch = device_properties(0).get("arch", "")
    return arch if arch in ARCHS else DEFAULT_ARCH


class MUSABackend(Backend):
    name = "musa"
    plugin_api = "1.13"  # capability_files() / arch_of() from the core's Backend
    distribution = "tilecore-musa"

    def parse_target(self, spec: str):
        arch = self.arch_of(spec, ARCHS, ALIASES, local_arch)
        if arch is None:
            return None
        return Target(backend=self.name, kind="musa", arch=arch, capability_id=PROFILES[arch])

    def targets(self) -> list:
        return [f"musa:{a}" for a in ARCHS]

    def _caps(self, target):
        from tilecore.plugin import profile_for

        return profile_for(target)

    def op_extensions(self, target) -> list:
        """``force_async_copy`` where the profile declares ``async_copy``, ``producer_threads`` where it
        declares TME (``bulk_tensor_copy``): PH1 here; QY2 refuses both, naming PH1."""
        caps = self._caps(target)
        out = []
        if caps.satisfies("feature:async_copy")[0] is True:
            out.append(EXTENSIONS["force_async_copy"])
        if caps.satisfies("feature:bulk_tensor_copy")[0] is True:
            out.append(EXTENSIONS["producer_threads"])
        return out

    def probe(self) -> Probe:
        mcc = mcc_version() if find_mcc() else ""
        try:
            n = device_count()
        except Exception:  # noqa: BLE001 - a probe never raises
            n = 0
        if not mcc or n == 0:
            missing = " and ".join(x for x, gone in (("mcc", not mcc), ("a MUSA device (libmusa)", n == 0)) if gone)
            check = "structure + clang stub check" if stub_dir() and find_clang() else "structure"
            return Probe("no-device" if mcc else "no-toolchain", toolchain=mcc,
                         detail=f"no {missing}: kernels are generated and checked only ({check}); {MCC_HINT}")
        devices, caps = [], {}
        for k in range(n):
            p = device_properties(k)
            devices.append(DeviceInfo(p.get("name", "Moore Threads GPU"), k, p))
            if k == 0:
                caps = {"execution.simd_width": p.get("warp_size"),
                        "memory.shared.max_bytes_per_block": p.get("shared_per_block"),
                        "execution.max_threads_per_block": p.get("max_threads_per_block")}
                caps = {key: v for key, v in caps.items() if v}
        return Probe("ok", tuple(devices), caps, toolchain=mcc)

    def intrinsics(self, target) -> list:
        from .lower import intrinsics

        return intrinsics(target)

    def passes(self, target) -> list:
        from tilecore.passes.simt import simt_distribute

        from .lower import async_barriers, note_threads, tme_pipelined_copies

        return [PassSpec("legalize", note_threads, position="after"),
                PassSpec("tile-lowering", tme_pipelined_copies, position="before"),
                PassSpec("before-codegen", simt_distribute, position="before"),
                PassSpec("before-codegen", async_barriers, position="after")]

    def matrix_units(self, target) -> list:
        from .units import units

        return units(target)

    def emitter(self, target):
        return MUSAEmitter()

    def runtime(self, target):
        return MUSARuntime(target.arch or DEFAULT_ARCH, self._caps(target))

    def toolchain_version(self, target) -> str:
        return self.runtime(target).compiler.version()


@hookimpl
def tilecore_backends():
    return [MUSABackend()]
