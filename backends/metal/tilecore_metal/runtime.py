"""The Metal runtime: PyObjC's Metal framework on macOS, codegen-only elsewhere.

On a Mac (``pyobjc-framework-Metal`` installed, a Metal device present) a kernel's MSL is compiled by
``newLibraryWithSource:options:error:`` with the options decision D3 asks for (``mathMode`` safe,
``fastMathEnabled`` NO, unless the kernel was compiled with ``tilecore.fast_math``; the MSL version the
source needs), one compute pipeline state per source and process (cached), buffers in shared storage
(host tensors: numpy arrays and CPU torch tensors, copied in, and copied back where the kernel writes
them; torch ``mps`` tensors wrapped by ``tilecore_metal.mps(t)`` bind their own Metal buffer, no copy:
tensor.py), scalars with ``setBytes``, launched with ``dispatchThreadgroups``; GPU time from the command
buffer's ``GPUStartTime``/``GPUEndTime`` (:data:`DEVICE_CLOCK`). Written and importable without macOS:
every ``Metal`` import is lazy, and there the runtime reports ``codegen-only``: ``build`` runs the
binding lint (``tilecore_metal.lint``) and returns the source, ``load`` refuses with the reason.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import struct
import sys
import threading
import time

from tilecore.errors import CompileError, DeviceError
from tilecore.plugin import Program, Runtime, Source
from tilecore.runtime.launch import AssertionTable, shape_fn

from .lint import check_bindings
from .tensor import resolve

#: MTLLanguageVersion values (major << 16 | minor)
LANGUAGE_VERSIONS = {"3.0": 0x30000, "3.1": 0x30001}
#: status words: the assertion code, a spare word, then up to 8 recorded 64-bit values
STATUS_WORDS = 2 + 2 * 8
_LOCK = threading.Lock()


@functools.lru_cache(maxsize=1)
def metal_module():
    """PyObjC's ``Metal`` module, or None (not macOS, or pyobjc-framework-Metal not installed)."""
    if sys.platform != "darwin":
        return None
    try:
        import Metal  # noqa: PLC0415 - macOS only
    except ImportError:
        return None
    return Metal


@functools.lru_cache(maxsize=1)
def default_device():
    mtl = metal_module()
    if mtl is None:
        return None
    try:
        return mtl.MTLCreateSystemDefaultDevice()
    except Exception:  # noqa: BLE001 - no device is an answer, not an error
        return None


#: MTLGPUFamilyApple7 .. 9 (MTLGPUFamily enum values)
FAMILY_CODES = {"apple9": 1009, "apple8": 1008, "apple7": 1007}


def device_family() -> str | None:
    """The newest Apple family of this tilecore's targets the local device supports, or None."""
    dev = default_device()
    if dev is None:
        return None
    for fam, code in FAMILY_CODES.items():
        try:
            if dev.supportsFamily_(code):
                return fam
        except Exception:  # noqa: BLE001
            return None
    return None


def device_properties() -> dict:
    dev = default_device()
    if dev is None:
        return {}
    return {"name": str(dev.name()), "family": device_family() or "",
            "max_threads_per_threadgroup": int(dev.maxThreadsPerThreadgroup().width),
            "threadgroup_memory": int(dev.maxThreadgroupMemoryLength())}


class _Clock:
    """GPU time of the launches so far (seconds), from the command buffers' GPU timestamps."""

    def __init__(self):
        self.total = 0.0

    def add(self, seconds: float) -> None:
        self.total += seconds

    def __call__(self) -> float:
        return self.total


DEVICE_CLOCK = _Clock()


class MetalRuntime(Runtime):
    tensor_device = "cpu"

    def __init__(self, family: str):
        self.family = family

    def mode(self) -> str:
        """``device`` on a Mac whose GPU has this target's family, else ``codegen-only`` (there is no Metal
        compiler off macOS: the source is generated and checked structurally)."""
        fam = device_family()
        if fam is None:
            return "codegen-only"
        order = list(FAMILY_CODES)[::-1]  # apple7, apple8, apple9
        return "device" if order.index(fam) >= order.index(self.family) else "codegen-only"

    def build(self, source: Source, options: dict) -> bytes:
        limit = source.meta.get("max_buffer_arguments")
        problems = check_bindings(source.code, int(limit) if limit else None)
        if problems:
            raise CompileError("generated MSL has binding errors:\n  " + "\n  ".join(problems))
        if self.mode() == "device":
            _pipeline(source.code, source.entry, bool(source.meta.get("fast_math")),
                      source.meta.get("msl_version", "3.0"))  # compile now: errors belong to compile()
        return source.code.encode()

    def load(self, binary: bytes, source: Source) -> Program:
        if self.mode() != "device":
            why = ("this is not macOS" if sys.platform != "darwin" else
                   "pyobjc-framework-Metal is not installed (pip install 'tilecore-metal[runtime]')"
                   if metal_module() is None else f"the GPU is not {self.family} or newer")
            raise DeviceError(f"metal:{self.family} kernels run only on a Mac with an Apple-silicon GPU: {why}. "
                              "Here the backend is codegen-only (kernel.get_kernel_source() gives the MSL)")
        return MetalProgram(binary.decode(), source)

    def timer(self):
        return DEVICE_CLOCK if self.mode() == "device" else time.perf_counter


@functools.lru_cache(maxsize=64)
def _pipeline(code: str, entry: str, fast: bool, version: str):
    """The compute pipeline state of one source (compiled once per process)."""
    mtl, dev = metal_module(), default_device()
    opts = mtl.MTLCompileOptions.new()
    opts.setFastMathEnabled_(fast)
    if hasattr(opts, "setMathMode_"):  # macOS 15: MTLMathModeSafe = 0, MTLMathModeFast = 2
        opts.setMathMode_(2 if fast else 0)
    opts.setLanguageVersion_(LANGUAGE_VERSIONS.get(version, LANGUAGE_VERSIONS["3.0"]))
    lib, err = dev.newLibraryWithSource_options_error_(code, opts, None)
    if lib is None:
        raise CompileError(f"the Metal compiler rejected the kernel:\n{err.localizedDescription() if err else ''}")
    fn = lib.newFunctionWithName_(entry)
    pso, err = dev.newComputePipelineStateWithFunction_error_(fn, None)
    if pso is None:
        raise CompileError(f"Metal could not create the pipeline: {err.localizedDescription() if err else ''}")
    return pso, hashlib.sha256(code.encode()).hexdigest()[:12]


def _torch_sync() -> None:
    """Wait for torch's queued MPS work (another command queue) before a kernel reads its tensors."""
    import torch  # noqa: PLC0415 - only reached with an mps tensor

    torch.mps.synchronize()


class MetalProgram(Program):
    def __init__(self, code: str, source: Source):
        self.mtl, self.dev = metal_module(), default_device()
        meta = source.meta
        self.pso, _ = _pipeline(code, source.entry, bool(meta.get("fast_math")), meta.get("msl_version", "3.0"))
        self.threads = int(meta.get("threads", 32))
        if self.threads > int(self.pso.maxTotalThreadsPerThreadgroup()):
            raise DeviceError(f"the kernel needs {self.threads} threads per threadgroup; this pipeline allows "
                              f"{int(self.pso.maxTotalThreadsPerThreadgroup())} (its registers and threadgroup "
                              "memory bound it): use fewer threads in T.Kernel")
        self.buffers = meta.get("buffers", [])
        self.grid_fn = shape_fn(meta.get("grid", ["1", "1", "1"]))
        self.size_fn = shape_fn([f"({' * '.join(['1', *b['shape']])}) * {int(b['itemsize'])}" for b in self.buffers])
        self.asserts = AssertionTable(meta)
        self.queue = self.dev.newCommandQueue()
        self.status = self.dev.newBufferWithLength_options_(4 * STATUS_WORDS, 0)

    def launch(self, buffers: list, ints: list, floats: list) -> None:
        mtl = self.mtl
        grid = self.grid_fn(ints)
        if min(grid) <= 0:
            return
        sizes = self.size_fn(ints)
        bufs, offsets, on_host, synced = [], [], [], False
        for addr, n in zip(buffers, sizes):
            t = resolve(addr)
            if t is not None:  # a torch mps tensor (tilecore_metal.mps): its own buffer, no copy
                if synced is False:
                    _torch_sync()
                    synced = True
                buf, off = t.metal_buffer()
                bufs.append(buf)
                offsets.append(off)
                on_host.append(False)
                continue
            data = ctypes.string_at(addr, n) if n else b"\0"
            bufs.append(self.dev.newBufferWithBytes_length_options_(data, max(n, 1), 0))  # shared storage
            offsets.append(0)
            on_host.append(True)
        with _LOCK:
            view = self.status.contents().as_buffer(4 * STATUS_WORDS)
            view[:] = bytes(4 * STATUS_WORDS)
            cb = self.queue.commandBuffer()
            enc = cb.computeCommandEncoder()
            enc.setComputePipelineState_(self.pso)
            k = 0
            for b, off in zip(bufs, offsets):
                enc.setBuffer_offset_atIndex_(b, off, k)
                k += 1
            for v in ints:
                enc.setBytes_length_atIndex_(struct.pack("<q", int(v)), 8, k)
                k += 1
            for v in floats:
                enc.setBytes_length_atIndex_(struct.pack("<f", float(v)), 4, k)
                k += 1
            enc.setBuffer_offset_atIndex_(self.status, 0, k)
            enc.dispatchThreadgroups_threadsPerThreadgroup_(mtl.MTLSizeMake(*grid), mtl.MTLSizeMake(self.threads, 1, 1))
            enc.endEncoding()
            cb.commit()
            cb.waitUntilCompleted()
            if cb.error() is not None:
                raise DeviceError(f"the Metal command buffer failed: {cb.error().localizedDescription()}")
            DEVICE_CLOCK.add(max(cb.GPUEndTime() - cb.GPUStartTime(), 0.0))
        for addr, n, b, desc, host in zip(buffers, sizes, bufs, self.buffers, on_host):
            if desc.get("written") and n and host:
                ctypes.memmove(addr, bytes(b.contents().as_buffer(n)), n)
        if self.asserts:
            words = self.status.contents().as_buffer(4 * STATUS_WORDS)
            code = struct.unpack_from("<i", words, 0)[0]
            if code:
                raise self.asserts.failure(code, list(struct.unpack_from("<8q", words, 8)))


__all__ = ["MetalRuntime", "MetalProgram", "metal_module", "default_device", "device_family", "device_properties",
           "DEVICE_CLOCK"]
