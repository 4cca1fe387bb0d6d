"""tilecore-ascend: Huawei Ascend AI Cores (AscendC), run here on an emulator that checks pipe synchronization.

Targets ``ascend:910b`` (Atlas A2) and ``ascend:a3``. Tile ops lower to AscendC instructions over UB tiles
(``intrinsics.py``), pipes are synchronized by ``ascend.insert_sync`` (``passes.py``), the emitter writes one
AscendC kernel (``codegen.py``) and the runtime compiles it with g++ against ``emulator/ascendc_emu.h`` and
reports mode ``emulated`` (``runtime.py``).
"""
from __future__ import annotations

from importlib import resources

from tilecore.plugin import Backend, DeviceInfo, PassSpec, Probe, Target, hookimpl

__version__ = "0.1.0"

ARCHS = {"910b": "ascend/910b", "a3": "ascend/a3"}


class AscendBackend(Backend):
    name = "ascend"
    plugin_api = "1.13"  # capability_files() / arch_of() from the core's Backend
    distribution = "tilecore-ascend"

    def parse_target(self, spec: str):
        arch = self.arch_of(spec, ARCHS, local=lambda: "910b")
        if arch is None:
            return None
        return Target(backend=self.name, kind="ascend", arch=arch, capability_id=ARCHS[arch])

    def targets(self) -> list:
        return [f"ascend:{a}" for a in ARCHS]

    def probe(self) -> Probe:
        from .runtime import cxx_version, find_cxx

        from .runtime import device_status, find_bisheng, cann_home

        ok, why = device_status()
        if ok:
            import torch

            devs = tuple(DeviceInfo(torch.npu.get_device_name(i), i, {}) for i in range(torch.npu.device_count()))
            return Probe("ok", devs, {}, detail="CANN and an NPU: kernels run on the device",
                         toolchain=find_bisheng(cann_home()) or "")
        if find_cxx() is None:
            return Probe("no-toolchain", detail=f"no device path ({why}) and the Ascend emulator needs a C++ "
                                                "compiler (apt-get install g++)")
        # one emulated device for every target: the emulator's capacities come from the target's profile
        dev = DeviceInfo("Ascend AI Core (AscendC emulated on the host CPU)", 0, {"emulated": True})
        return Probe("ok", (dev,), {}, detail=f"not on an NPU ({why}): kernels run on the AscendC emulator",
                     toolchain=cxx_version())

    def intrinsics(self, target) -> list:
        from .intrinsics import TABLE

        return list(TABLE)

    def passes(self, target) -> list:
        from .passes import insert_sync, plan_onchip
        from .cube import lower_cube
        from .double_buffer import double_buffer
        from .legalize import place_shared
        from .vectorize import vectorize_parallel

        return [PassSpec("legalize", place_shared, "before"), PassSpec("tile-lowering", lower_cube, "before"), PassSpec("tile-lowering", vectorize_parallel, "before"),
                PassSpec("pipelining", double_buffer, "before"), PassSpec("memory", plan_onchip, "after"),
                PassSpec("before-codegen", insert_sync, "after")]

    def emitter(self, target):
        from .codegen import AscendCEmitter

        return AscendCEmitter()

    def runtime(self, target):
        from .runtime import AscendDeviceRuntime, AscendEmulatedRuntime, device_status

        return AscendDeviceRuntime(target.arch) if device_status()[0] else AscendEmulatedRuntime()

    def toolchain_version(self, target) -> str:
        from .runtime import cxx_version

        return f"{cxx_version()} | emulator {_emulator_digest()}"


def _emulator_digest() -> str:
    import hashlib

    h = hashlib.sha256()
    for name in ("emulator/ascendc_emu.h", "prelude/tc_ascend.h"):
        h.update(resources.files("tilecore_ascend").joinpath(name).read_bytes())
    return h.hexdigest()[:12]


@hookimpl
def tilecore_backends():
    return [AscendBackend()]
