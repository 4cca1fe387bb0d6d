"""tilecore-webgpu: WebGPU compute shaders (WGSL) run through wgpu-py.

The generic lowering of every tile op, distributed over the workgroup by the core's
``tilecore.simt_distribute`` pass, printed as WGSL by a subclass of the core's shading-language
emitter, compiled and launched by wgpu on any adapter (lavapipe, Mesa's Vulkan rasterizer on the
CPU, on machines without a GPU). Tensors are host tensors (numpy, CPU torch), which a launch moves,
or GPU-resident ones (``to_device``), which it binds as they are.

Targets: ``webgpu`` (the first adapter; the profile ``webgpu/desktop`` when the adapter has
shader-f16 and 32 KiB of workgroup storage, ``webgpu/desktop-subgroups`` when it also has the
subgroups feature, else ``webgpu/baseline``), ``webgpu:baseline``, ``webgpu:desktop`` and
``webgpu:desktop-subgroups`` (that profile on the first adapter), ``webgpu:<adapter>`` (an adapter by
index or by a piece of its name, e.g. ``webgpu:llvmpipe``; the profile chosen from it).

Tile ops this backend lowers itself (``tilecore_webgpu.intrinsics``): ``T.gemm`` as a register-blocked
tiled loop, ``T.reduce_*`` with subgroup operations where the profile has ``subgroup_ops``. Tensors
may stay on the GPU between launches: :func:`to_device` gives a :class:`DeviceTensor`.
"""
from __future__ import annotations

import functools

from tilecore.plugin import Backend, DeviceInfo, PassSpec, Probe, Target, hookimpl

from .codegen import WebGPUEmitter
from .intrinsics import INTRINSICS
from .runtime import WebGPURuntime, adapter_info, adapters, has_subgroups, select_adapter, wgpu_version

__version__ = "0.2.0"

PROFILES = ("baseline", "desktop", "desktop-subgroups")
#: adapter features the backend uses or reports (the probe lists these, not the rendering ones)
USED_FEATURES = ("shader-f16", "subgroup", "subgroups", "timestamp-query", "shader-float32-atomic")
DESKTOP_WORKGROUP_BYTES = 32768


def probed_values(adapter) -> dict:
    """The adapter's features and limits in the capability files' shape (dotted keys).

    Only fields the profiles mark ``provenance: probe`` (floors an adapter may exceed) or that every
    adapter of a profile shares are reported, so a bigger adapter is no CAPABILITY_MISMATCH; the
    workgroup storage is reported as ``memory.shared.max_bytes_per_block``."""
    lim, feats = adapter.limits, adapter.features
    wg = int(lim.get("max-compute-workgroup-storage-size", 16384))
    return {
        "memory.shared.max_bytes_per_block": wg,
        "limits.max_threads_per_block.value": int(lim.get("max-compute-invocations-per-workgroup", 256)),
        "execution.max_threads_per_block": int(lim.get("max-compute-invocations-per-workgroup", 256)),
        "limits.max_storage_buffers_per_stage.value": int(lim.get("max-storage-buffers-per-shader-stage", 8)),
        "limits.max_storage_buffer_binding_size.value": int(lim.get("max-storage-buffer-binding-size", 134217728)),
        "limits.max_buffer_size.value": int(lim.get("max-buffer-size", 268435456)),
        "limits.max_workgroups_per_dimension.value": int(lim.get("max-compute-workgroups-per-dimension", 65535)),
        "dtypes.float16.storage": "shader-f16" in feats,
        "dtypes.float16.arith": "shader-f16" in feats,
        "features.subgroup_ops": has_subgroups(adapter),
    }


@functools.lru_cache(maxsize=None)
def profile_of(selector: str = "") -> str:
    """The capability profile an adapter satisfies: desktop-subgroups (desktop plus the subgroups
    feature), desktop (shader-f16, 32 KiB workgroup storage) or baseline; baseline when there is no
    adapter (compiling for the spec's guarantees)."""
    try:
        a = select_adapter(selector)
    except Exception:  # noqa: BLE001 - no adapter: the portable profile
        return "webgpu/baseline"
    v = probed_values(a)
    ok = (v["dtypes.float16.storage"] and v["memory.shared.max_bytes_per_block"] >= DESKTOP_WORKGROUP_BYTES
          and v["limits.max_threads_per_block.value"] >= 256 and v["limits.max_storage_buffers_per_stage.value"] >= 8)
    if not ok:
        return "webgpu/baseline"
    return "webgpu/desktop-subgroups" if v["features.subgroup_ops"] else "webgpu/desktop"


class WebGPUBackend(Backend):
    name = "webgpu"
    plugin_api = "1.13"  # capability_files() / arch_of() from the core's Backend
    distribution = "tilecore-webgpu"

    def parse_target(self, spec: str):
        text = spec.strip()
        low = text.lower()
        if low == "webgpu":
            return Target(backend=self.name, kind="webgpu", capability_id=profile_of(""))
        if not low.startswith("webgpu:"):
            return None
        rest = text[7:].strip()
        if rest.lower() in PROFILES:
            return Target(backend=self.name, kind="webgpu", arch=rest.lower(), capability_id=f"webgpu/{rest.lower()}")
        if not rest:
            return None
        return Target(backend=self.name, kind="webgpu", arch=rest, options=(("adapter", rest),),
                      capability_id=profile_of(rest))

    def targets(self) -> list:
        return ["webgpu", *(f"webgpu:{p}" for p in PROFILES)]

    def probe(self) -> Probe:
        tc = wgpu_version()
        if not tc:
            return Probe("no-toolchain", detail="wgpu-py is not installed (pip install wgpu)")
        found = adapters()
        if not found:
            return Probe("no-device", toolchain=tc,
                         detail="no WebGPU adapter (without a GPU: apt-get install mesa-vulkan-drivers for lavapipe)")
        devices = []
        for k, a in enumerate(found):
            i = adapter_info(a)
            devices.append(DeviceInfo(i["name"], k, {"type": i["type"], "backend": i["backend"], "vendor": i["vendor"],
                                                     "driver": i["driver"], "profile": profile_of(str(k)),
                                                     "features": sorted(f for f in a.features if f in USED_FEATURES)}))
        first = adapter_info(found[0])
        return Probe("ok", tuple(devices), probed_values(found[0]), toolchain=tc,
                     detail=f"adapter {first['name']} (type {first['type']}, backend {first['backend']})")

    def intrinsics(self, target) -> list:
        return list(INTRINSICS)

    def passes(self, target) -> list:
        from tilecore.passes.simt import simt_distribute  # compile-time only: loading a kernel needs no passes

        return [PassSpec("before-codegen", simt_distribute, position="before")]

    def emitter(self, target):
        return WebGPUEmitter()

    def runtime(self, target):
        return WebGPURuntime(dict(target.options).get("adapter", ""))

    def toolchain_version(self, target) -> str:
        return wgpu_version()


def __getattr__(name: str):
    # GPU-resident tensors need numpy: imported on first use, not when the plugin loads
    if name in ("DeviceTensor", "empty", "to_device"):
        from . import tensor

        return getattr(tensor, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@hookimpl
def tilecore_backends():
    return [WebGPUBackend()]
