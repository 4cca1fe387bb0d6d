"""Load and launch code objects through the HIP runtime, reached with ``hip-python`` (``pip install
hip-python``, the ROCm project's Cython bindings; needs ROCm's ``libamdhip64`` and a device); building
them is ``compiler.py``'s job.

On a machine with ROCm and an AMD GPU: ``hipModuleLoadData`` + ``hipModuleGetFunction`` once per device,
``hipModuleLaunchKernel`` on torch's current stream (ROCm torch calls its device ``cuda``, so
``tensor_device`` is ``"cuda"``), and the mode is ``device`` when the device's architecture is the
target's. Without hip-python or a device the backend compiles only (``compile-only``): ``load`` raises
:class:`~tilecore.errors.DeviceError`. This path has not run on an AMD GPU in tilecore's CI (there is
none); tests check its no-device behaviour.
"""
from __future__ import annotations

import ctypes
import functools
import os
import time

from tilecore.errors import MAX_FAULT_VALUES, DeviceError
from tilecore.plugin import Program, Runtime, Source
from tilecore.runtime.launch import AssertionTable, shape_fn

from .compiler import HIPCompiler

STATUS_WORDS = 2 + 2 * MAX_FAULT_VALUES


@functools.lru_cache(maxsize=1)
def _hip():
    """hip-python's ``hip.hip`` module, or None (not installed, or no ROCm runtime library under it)."""
    try:
        from hip import hip  # type: ignore
    except Exception:  # noqa: BLE001 - any import problem means no runtime
        return None
    return hip


def _ok(res):
    """hip-python returns ``(hipError_t, values...)``: the values, or a DeviceError naming the error."""
    err, *vals = res if isinstance(res, tuple) else (res,)
    if int(err) != 0:
        raise DeviceError(f"HIP error {int(err)} ({err})")
    return vals[0] if len(vals) == 1 else vals


@functools.lru_cache(maxsize=1)
def device_count() -> int:
    hip = _hip()
    if hip is None:
        return 0
    try:
        err, n = hip.hipGetDeviceCount()
    except Exception:  # noqa: BLE001 - no libamdhip64, no driver
        return 0
    return int(n) if int(err) == 0 else 0


def device_properties(index: int = 0) -> dict:
    hip = _hip()
    try:
        props = _ok(hip.hipGetDeviceProperties(index))
    except Exception:  # noqa: BLE001
        return {}
    arch = props.gcnArchName
    arch = arch.decode() if isinstance(arch, bytes) else str(arch)
    name = props.name.decode(errors="replace") if isinstance(props.name, bytes) else str(props.name)
    return {"name": name, "arch": arch.split(":")[0], "warp_size": int(props.warpSize),
            "shared_per_block": int(props.sharedMemPerBlock), "max_threads_per_block": int(props.maxThreadsPerBlock),
            "cu_count": int(props.multiProcessorCount)}


def runtime_version() -> str:
    hip = _hip()
    if hip is None or device_count() == 0:
        return ""
    try:
        return f"HIP runtime {_ok(hip.hipRuntimeGetVersion())}"
    except Exception:  # noqa: BLE001
        return "HIP runtime"


class HIPRuntime(Runtime):
    tensor_device = "cuda"  # ROCm builds of torch keep the CUDA device type

    def __init__(self, arch: str = "gfx942"):
        self.arch = arch
        self.compiler = HIPCompiler(arch)

    def build(self, source: Source, options: dict) -> bytes:
        return self.compiler.compile(source, options)

    def load(self, binary: bytes, source: Source) -> "HIPProgram":
        if _hip() is None:
            raise DeviceError("cannot run HIP kernels here: hip-python is not installed (pip install hip-python, on "
                              "a machine with ROCm); this kernel was compiled for " + source.meta.get("arch", self.arch))
        if device_count() == 0:
            raise DeviceError("no AMD GPU found (hipGetDeviceCount reports none): this kernel was compiled for "
                              + source.meta.get("arch", self.arch) + " but cannot run on this machine")
        return HIPProgram(binary, source)

    def mode(self) -> str:
        """``device`` where hip-python finds a GPU of this target's architecture, else ``compile-only``."""
        if device_count() == 0:
            return "compile-only"
        return "device" if device_properties(0).get("arch") == self.arch else "compile-only"

    def timer(self):
        import torch

        def now() -> float:
            torch.cuda.synchronize()
            return time.perf_counter()

        return now


class HIPProgram(Program):
    def __init__(self, binary: bytes, source: Source):
        import torch

        self.torch, self.hip = torch, _hip()
        self.binary, self.entry, self.meta = binary, source.entry, dict(source.meta)
        self.asserts = AssertionTable(self.meta)
        self.grid_fn = shape_fn(self.meta.get("grid", ["1", "1", "1"]))
        self.threads = int(self.meta.get("threads", 64))
        self.dyn_shared = int(self.meta.get("dynamic_shared_bytes", 0))
        self.funcs: dict = {}
        self.status = None
        env = os.environ.get("TILECORE_DEVICE")
        self._env_device = int(env) if env is not None and env.isdigit() else None

    def _function(self, dev: int):
        if dev not in self.funcs:
            hip = self.hip
            _ok(hip.hipSetDevice(dev))
            module = _ok(hip.hipModuleLoadData(self.binary))
            self.funcs[dev] = (module, _ok(hip.hipModuleGetFunction(module, self.entry.encode())))
        return self.funcs[dev][1]

    def launch(self, buffers: list, ints: list, floats: list) -> None:
        torch = self.torch
        dev = self._env_device if self._env_device is not None else torch.cuda.current_device()
        func = self._function(dev)
        grid = self.grid_fn(ints)
        if min(grid) <= 0:
            return
        if self.status is None or self.status.device.index != dev:
            self.status = torch.zeros(STATUS_WORDS, dtype=torch.int32, device=f"cuda:{dev}")
        vals = ([ctypes.c_void_p(int(b)) for b in buffers] + [ctypes.c_longlong(int(i)) for i in ints]
                + [ctypes.c_double(float(f)) for f in floats] + [ctypes.c_void_p(self.status.data_ptr())])
        params = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
        stream = torch.cuda.current_stream(dev).cuda_stream
        _ok(self.hip.hipModuleLaunchKernel(func, *grid, self.threads, 1, 1, self.dyn_shared, stream, params, None))
        if self.asserts:
            code = int(self.status[0].item())
            if code:
                values = self.status[2:].view(torch.int64).tolist()
                self.status.zero_()
                raise self.asserts.failure(code, values)

    def synchronize(self) -> None:
        self.torch.cuda.synchronize()
