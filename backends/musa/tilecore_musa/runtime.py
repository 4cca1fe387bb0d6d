"""Load and launch MUSA device binaries through the MUSA driver API (``libmusa.so``, reached with ctypes).

On a machine with the MUSA SDK and a Moore Threads GPU (torch_musa tensors, device type ``musa``):
``muInit``, ``muDeviceGet``, ``muDevicePrimaryCtxRetain``/``muCtxSetCurrent``, ``muModuleLoadData``,
``muModuleGetFunction`` once, ``muLaunchKernel`` with the kernel's parameters (tensor addresses, ABI
scalars, host-built TME descriptors, the status word), and the mode is ``device``. The driver calls mirror
the CUDA driver API with the ``mu`` prefix (MUSA SDK documentation); this path has not run anywhere yet:
no MUSA device or SDK was reachable when it was written. Without ``libmusa`` or a device the backend
checks code only (``codegen-only``): ``load`` raises :class:`~tilecore.errors.DeviceError`.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import time

from tilecore.errors import MAX_FAULT_VALUES, DeviceError
from tilecore.plugin import Program, Runtime, Source
from tilecore.runtime.launch import AssertionTable, shape_fn

from .compiler import MUSACompiler, find_mcc

STATUS_WORDS = 2 + 2 * MAX_FAULT_VALUES
LIB_CANDIDATES = ("libmusa.so", "libmusa.so.1", "/usr/local/musa/lib/libmusa.so")
#: MUtensorDescriptorDataType values of the tensor dtypes TME loads read (mirroring CUtensorMapDataType)
TME_DTYPES = {"uint8": 0, "uint16": 1, "uint32": 2, "int32": 3, "uint64": 4, "int64": 5, "float16": 6,
              "float32": 7, "float64": 8, "bfloat16": 9}
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int32": 4, "uint32": 4, "int64": 8,
               "uint64": 8, "uint8": 1, "uint16": 2}


@functools.lru_cache(maxsize=1)
def _lib():
    """The MUSA driver library, or None."""
    env = os.environ.get("TILECORE_MUSA_DRIVER")
    for name in ([env] if env else []) + list(LIB_CANDIDATES) + [ctypes.util.find_library("musa") or ""]:
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        return lib
    return None


def _ok(err: int, what: str) -> None:
    if err != 0:
        raise DeviceError(f"MUSA driver error {err} in {what}")


@functools.lru_cache(maxsize=1)
def device_count() -> int:
    lib = _lib()
    if lib is None:
        return 0
    try:
        if lib.muInit(0) != 0:
            return 0
        n = ctypes.c_int(0)
        return n.value if lib.muDeviceGetCount(ctypes.byref(n)) == 0 else 0
    except (AttributeError, OSError):
        return 0


def device_properties(index: int = 0) -> dict:
    """name, arch (``mp_<major><minor>``), warp size, shared memory per block of device ``index``."""
    lib = _lib()
    dev = ctypes.c_int(0)
    try:
        _ok(lib.muDeviceGet(ctypes.byref(dev), index), "muDeviceGet")
        name = ctypes.create_string_buffer(256)
        _ok(lib.muDeviceGetName(name, 256, dev), "muDeviceGetName")
        vals = {}
        # MU_DEVICE_ATTRIBUTE_* values mirror the CUDA driver's enumeration (warp size 10, shared memory per
        # block 8, max threads per block 1, compute capability major 75 / minor 76)
        for key, attr in (("warp_size", 10), ("shared_per_block", 8), ("max_threads_per_block", 1), ("major", 75),
                          ("minor", 76)):
            v = ctypes.c_int(0)
            _ok(lib.muDeviceGetAttribute(ctypes.byref(v), attr, dev), "muDeviceGetAttribute")
            vals[key] = v.value
    except (AttributeError, OSError, DeviceError):
        return {}
    return {"name": name.value.decode(errors="replace"), "arch": f"mp_{vals['major']}{vals['minor']}", **vals}


class MUSARuntime(Runtime):
    tensor_device = "musa"  # torch_musa's device type

    def __init__(self, arch: str = "mp_31", capabilities=None):
        self.arch = arch
        self.compiler = MUSACompiler(arch, capabilities)

    def build(self, source: Source, options: dict) -> bytes:
        return self.compiler.compile(source, options)

    def mode(self) -> str:
        """``device`` with mcc and a GPU of this target's arch, ``compile-only`` with mcc alone; without mcc
        only the generated code is checked (``codegen-only``)."""
        if not find_mcc():
            return "codegen-only"
        if device_count() and device_properties(0).get("arch") == self.arch:
            return "device"
        return "compile-only"

    def load(self, binary: bytes, source: Source) -> "MUSAProgram":
        mode = self.mode()
        if mode != "device":
            arch = source.meta.get("arch", self.arch)
            raise DeviceError(f"cannot run MUSA kernels here: no MUSA device of arch {arch} "
                              "with mcc and the MUSA driver (libmusa) was found; this backend only "
                              f"{'compiles' if mode == 'compile-only' else 'generates and checks'} MUSA code on this "
                              f"machine (mode {mode})")
        return MUSAProgram(_lib(), binary, source)

    def timer(self):
        import torch

        def now() -> float:
            torch.musa.synchronize()
            return time.perf_counter()

        return now


class MUSAProgram(Program):
    def __init__(self, lib, binary: bytes, source: Source):
        import torch

        self.torch, self.lib = torch, lib
        self.meta = dict(source.meta)
        self.asserts = AssertionTable(self.meta)
        self.grid_fn = shape_fn(self.meta.get("grid", ["1", "1", "1"]))
        self.threads = int(self.meta.get("threads", 128))
        self.dyn_shared = int(self.meta.get("dynamic_shared_bytes", 0))
        module, func = ctypes.c_void_p(), ctypes.c_void_p()
        _ok(lib.muModuleLoadData(ctypes.byref(module), ctypes.c_char_p(binary)), "muModuleLoadData")
        _ok(lib.muModuleGetFunction(ctypes.byref(func), module, source.entry.encode()), "muModuleGetFunction")
        self.module, self.func = module, func
        self.status = torch.zeros(STATUS_WORDS, dtype=torch.int32, device="musa")

    def _descriptor(self, spec: dict, buffers: list, shapes: list):
        """A TME descriptor of the tensor ``spec['tensor']`` with the kernel's box (``muTensorDescriptorEncode``,
        the MUSA counterpart of cuTensorMapEncodeTiled; dimension 0 innermost)."""
        desc = (ctypes.c_ubyte * 128)()
        shape = list(reversed(shapes[spec["tensor"]]))
        nbytes = DTYPE_BYTES[spec["dtype"]]
        rank = len(shape)
        dims = (ctypes.c_uint64 * rank)(*shape)
        strides, s = [], nbytes
        for d in shape[:-1]:
            s *= d
            strides.append(s)
        stride_arr = (ctypes.c_uint64 * max(rank - 1, 1))(*(strides or [0]))
        box = (ctypes.c_uint32 * rank)(*reversed(spec["box"]))
        ones = (ctypes.c_uint32 * rank)(*([1] * rank))
        base = ctypes.c_void_p(buffers[spec["tensor"]])
        _ok(self.lib.muTensorDescriptorEncode(desc, TME_DTYPES[spec["dtype"]], rank, base, dims, stride_arr, box, ones,
                                              0, 0, 0, 0), "muTensorDescriptorEncode")
        return desc

    def launch(self, buffers: list, ints: list, floats: list, shapes: list | None = None) -> None:
        grid = self.grid_fn(ints)
        if min(grid) <= 0:
            return
        vals = ([ctypes.c_void_p(int(b)) for b in buffers] + [ctypes.c_longlong(int(i)) for i in ints]
                + [ctypes.c_double(float(f)) for f in floats])
        if self.meta.get("tme_descriptors"):
            if shapes is None:
                raise DeviceError("TME descriptors need the tensors' shapes, which this launch did not pass")
            vals += [self._descriptor(d, buffers, shapes) for d in self.meta["tme_descriptors"]]
        vals.append(ctypes.c_void_p(self.status.data_ptr()))
        params = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
        stream = ctypes.c_void_p(self.torch.musa.current_stream().musa_stream)
        _ok(self.lib.muLaunchKernel(self.func, *grid, self.threads, 1, 1, self.dyn_shared, stream, params, None),
            "muLaunchKernel")
        if self.asserts:
            code = int(self.status[0].item())
            if code:
                values = self.status[2:].view(self.torch.int64).tolist()
                self.status.zero_()
                raise self.asserts.failure(code, values)

    def synchronize(self) -> None:
        self.torch.musa.synchronize()
