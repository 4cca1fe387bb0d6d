"""The wgpu runtime: adapters and devices, buffers moved from and to host memory, cached pipelines.

Kernels take host tensors (``tensor_device = "cpu"``: numpy arrays and CPU torch tensors) and
GPU-resident ones (:class:`~tilecore_webgpu.tensor.DeviceTensor`, made by ``to_device``). A launch
uploads every host tensor argument into a storage buffer, binds a resident tensor's own buffer as it
is, writes the scalar arguments and the grid into one uniform buffer, dispatches, and copies the
buffers the kernel writes back to the host memory they came from (resident ones stay on the GPU).
Buffer sizes come from the shapes in ``Source.meta`` (symbolic dimensions are Python expressions over
the ABI integers). :data:`TRANSFERS` counts the tensor copies between host and GPU.

Heavy state is cached per process: one device per adapter, one compute pipeline per shader source
(``build`` already compiled it, so ``load`` is a dictionary hit), bind groups per buffer set.
"""
from __future__ import annotations

import collections
import ctypes
import functools
import hashlib
import math
import os
import struct
import threading
import time
import weakref

from tilecore.errors import MAX_FAULT_VALUES, CompileError, DeviceError
from tilecore.plugin import Program, Runtime, Source
from tilecore.runtime.launch import AssertionTable, shape_fn

#: the backends wgpu can sit on, best first: the GL backend is a fallback that lists the same
#: software device a second time on CPU-only machines
_BACKEND_ORDER = {"Vulkan": 0, "Metal": 0, "D3D12": 0, "OpenGL": 2}
#: bind groups cached per kernel (one per set of buffers it was launched on)
MAX_BIND_GROUPS = 64
_LOCK = threading.Lock()


def wgpu_module():
    """``import wgpu`` (raises ImportError when wgpu-py is missing; callers turn that into a status)."""
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")  # the GL loader complains without it
    import wgpu  # noqa: PLC0415 - optional at import time of the plugin

    return wgpu


@functools.lru_cache(maxsize=1)
def adapters() -> tuple:
    """The usable adapters, best first; the GL fallback only when nothing else exists."""
    try:
        wgpu = wgpu_module()
        found = list(wgpu.gpu.enumerate_adapters_sync())
    except Exception:  # noqa: BLE001 - no wgpu, no driver: no adapters
        return ()
    found.sort(key=lambda a: _BACKEND_ORDER.get(a.info.get("backend_type", ""), 1))
    best = [a for a in found if a.info.get("backend_type") != "OpenGL"]
    return tuple(best or found)


def adapter_info(adapter) -> dict:
    info = adapter.info
    return {"name": info.get("device") or info.get("description") or "adapter",
            "type": info.get("adapter_type", ""), "backend": info.get("backend_type", ""),
            "vendor": info.get("vendor", ""), "driver": info.get("description", "")}


def select_adapter(selector: str = ""):
    """The adapter for ``webgpu:<selector>`` (an index or a piece of its name), else the one
    ``TILECORE_DEVICE`` names, else the first."""
    found = adapters()
    if not found:
        raise DeviceError("no WebGPU adapter: install wgpu (pip install wgpu) and a driver; on a machine "
                          "without a GPU, Debian's mesa-vulkan-drivers (lavapipe)")
    if selector:
        if selector.isdigit():
            k = int(selector)
            if k < len(found):
                return found[k]
        for a in found:
            i = adapter_info(a)
            if selector.lower() in f"{i['name']} {i['backend']} {i['vendor']}".lower():
                return a
        raise DeviceError(f"no WebGPU adapter matches {selector!r}; found: "
                          + ", ".join(adapter_info(a)["name"] for a in found))
    env = os.environ.get("TILECORE_DEVICE", "")
    if env.isdigit():
        return found[int(env) % len(found)]
    return found[0]


_DEVICES: dict = {}
#: the adapter feature behind subgroup operations: WebGPU's name, and wgpu-native's (wgpu-py 0.32 lists "subgroup")
SUBGROUP_FEATURES = ("subgroups", "subgroup")


def has_subgroups(adapter) -> bool:
    return any(f in adapter.features for f in SUBGROUP_FEATURES)


def device_for(adapter):
    """One device per adapter, with shader-f16, subgroups and timestamp queries when it has them and its own
    limits (not the spec defaults) for workgroup storage, invocations and storage buffers."""
    with _LOCK:
        key = id(adapter)
        if key in _DEVICES:
            return _DEVICES[key]
        feats = [f for f in ("shader-f16", "timestamp-query", *SUBGROUP_FEATURES) if f in adapter.features]
        lim = adapter.limits
        wanted = {k: lim[k] for k in ("max-compute-workgroup-storage-size", "max-compute-invocations-per-workgroup",
                                      "max-compute-workgroup-size-x", "max-compute-workgroup-size-y",
                                      "max-compute-workgroup-size-z", "max-storage-buffers-per-shader-stage",
                                      "max-storage-buffer-binding-size", "max-buffer-size",
                                      "max-compute-workgroups-per-dimension") if k in lim}
        dev = adapter.request_device_sync(required_features=feats, required_limits=wanted)
        _DEVICES[key] = dev
        return dev


def wgpu_version() -> str:
    try:
        return f"wgpu-py {wgpu_module().__version__}"
    except Exception:  # noqa: BLE001
        return ""


# -- GPU-resident tensors ----------------------------------------------------------------------------

#: tensor copies so far: ``uploads``/``downloads`` (count) and ``upload_bytes``/``download_bytes``
TRANSFERS: collections.Counter = collections.Counter()
#: handle of a resident tensor (see tensor.DeviceTensor) -> weak reference to the tensor
_RESIDENT: dict = {}


def count_transfer(kind: str, nbytes: int) -> None:
    TRANSFERS[kind + "s"] += 1
    TRANSFERS[kind + "_bytes"] += nbytes


def register_resident(tensor, handle: int) -> None:
    """Remember which GPU tensor a launch argument's handle stands for (while the tensor lives)."""
    def drop(ref, handle=handle):
        if _RESIDENT.get(handle) is ref:
            del _RESIDENT[handle]

    _RESIDENT[handle] = weakref.ref(tensor, drop)


def resident(addr: int):
    """The resident tensor a launch argument stands for, or None for host memory."""
    ref = _RESIDENT.get(addr)
    return ref() if ref is not None else None


# -- pipelines ------------------------------------------------------------------------------------

_PIPELINES: dict = {}


def _layout(dev, nbuffers: int):
    wgpu = wgpu_module()
    entries = [{"binding": 0, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": "uniform"}}]
    for k in range(nbuffers):
        entries.append({"binding": k + 1, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": "storage"}})
    bgl = dev.create_bind_group_layout(entries=entries)
    return bgl, dev.create_pipeline_layout(bind_group_layouts=[bgl])


def pipeline(dev, code: str, entry: str, nbuffers: int):
    """The compute pipeline for ``code`` on ``dev`` (compiled once per process)."""
    key = (id(dev), hashlib.sha256(code.encode()).hexdigest(), entry)
    with _LOCK:
        hit = _PIPELINES.get(key)
    if hit is not None:
        return hit
    try:
        module = dev.create_shader_module(code=code)
        bgl, layout = _layout(dev, nbuffers)
        pipe = dev.create_compute_pipeline(layout=layout, compute={"module": module, "entry_point": entry})
    except Exception as e:  # noqa: BLE001 - the shader compiler's message is the useful part
        raise CompileError(f"the WebGPU shader compiler rejected the generated code:\n{str(e)[-4000:]}\n"
                           "This is a tilecore bug; please report it with kernel.get_kernel_source()") from None
    with _LOCK:
        _PIPELINES[key] = (pipe, bgl)
    return pipe, bgl


# -- device time ------------------------------------------------------------------------------------

class _DeviceClock:
    """Seconds of device time spent in kernels so far (from timestamp queries), a clock for the
    profiler: ``clock() - t0`` over a run is the device time of that run."""

    def __init__(self):
        self.total_ns = 0
        self.measured = False

    def add(self, ns: int) -> None:
        self.total_ns += max(0, ns)
        self.measured = True

    def __call__(self) -> float:
        return self.total_ns * 1e-9


DEVICE_CLOCK = _DeviceClock()


class WebGPURuntime(Runtime):
    tensor_device = "cpu"

    def __init__(self, selector: str = ""):
        self.selector = selector

    def _adapter(self):
        return select_adapter(self.selector)

    def build(self, source: Source, options: dict) -> bytes:
        """The shader text; when an adapter exists it is compiled here so errors surface at compile time."""
        if adapters():
            nbuf = len(source.meta.get("buffers", [])) + bool(source.meta.get("asserts"))  # + the fault buffer
            pipeline(device_for(self._adapter()), source.code, source.entry, nbuf)
        return source.code.encode()

    def load(self, binary: bytes, source: Source) -> "WebGPUProgram":
        return WebGPUProgram(self._adapter(), binary.decode(), source)

    def mode(self) -> str:
        return "device" if adapters() else "codegen-only"

    def timer(self):
        """Device time from timestamp queries when the device has them, else the host clock (launches
        are synchronous: a launch returns after its outputs are back)."""
        try:
            dev = device_for(self._adapter())
        except Exception:  # noqa: BLE001
            return time.perf_counter
        return DEVICE_CLOCK if "timestamp-query" in dev.features else time.perf_counter


class WebGPUProgram(Program):
    def __init__(self, adapter, code: str, source: Source):
        self.wgpu = wgpu_module()
        self.dev = device_for(adapter)
        meta = source.meta
        self.buffers = meta.get("buffers", [])
        self.grid_fn = shape_fn(meta.get("grid", ["1"]))
        self.size_fn = shape_fn([f"({' * '.join(['1', *b['shape']])}) * {int(b['itemsize'])}" for b in self.buffers])
        self.nints, self.nfloats = int(meta.get("nints", 0)), int(meta.get("nfloats", 0))
        self.arg_words = int(meta.get("arg_words", 4))
        self.max_per_dim = int(meta.get("max_workgroups_per_dimension", 65535))
        self.asserts = AssertionTable(meta)
        self.fault = None  # the fault buffer of a kernel with assertions (checked mode), bound last
        if self.asserts:
            self.fault_bytes = 4 * (1 + MAX_FAULT_VALUES)
            self.fault = self.dev.create_buffer(size=self.fault_bytes, usage=self.wgpu.BufferUsage.STORAGE
                                                | self.wgpu.BufferUsage.COPY_DST | self.wgpu.BufferUsage.COPY_SRC)
        self.pipe, self.bgl = pipeline(self.dev, code, source.entry, len(self.buffers) + bool(self.fault))
        self.pool: dict = {}
        self.groups: dict = {}
        self.pending = False  # work submitted that no read-back has waited for
        self.fence = None
        self.timestamps = "timestamp-query" in self.dev.features
        if self.timestamps:
            self.qset = self.dev.create_query_set(type=self.wgpu.QueryType.timestamp, count=2)
            self.qbuf = self.dev.create_buffer(size=16, usage=self.wgpu.BufferUsage.QUERY_RESOLVE
                                               | self.wgpu.BufferUsage.COPY_SRC)

    def synchronize(self) -> None:
        """Wait for launched work (a launch whose outputs all stay on the GPU returns before it ends):
        reading a buffer back waits for everything submitted before it."""
        if self.pending:
            if self.fence is None:
                self.fence = self.dev.create_buffer(size=4, usage=self.wgpu.BufferUsage.COPY_SRC)
            self.dev.queue.read_buffer(self.fence, 0, 4)
            self.pending = False

    def _buffer(self, slot, nbytes: int, usage):
        key = (slot, nbytes)
        buf = self.pool.get(key)
        if buf is None:
            buf = self.pool[key] = self.dev.create_buffer(size=nbytes, usage=usage)
        return buf

    def _dispatch_dims(self, total: int) -> tuple:
        m = self.max_per_dim
        if total <= m:
            return (total, 1, 1)
        y = -(-total // m)
        if y <= m:
            return (m, y, 1)
        z = -(-y // m)
        if z > m:
            raise DeviceError(f"the grid has {total} blocks, more than this adapter can dispatch ({m}^3)")
        return (m, m, z)

    def launch(self, buffers: list, ints: list, floats: list) -> None:
        wgpu = self.wgpu
        usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC
        grid = list(self.grid_fn(ints))
        nbytes = self.size_fn(ints)
        total = math.prod(grid)
        if total <= 0:
            return
        # scalar arguments and grid extents, one 32-bit word each
        words = []
        for v in ints:
            if not -2**31 <= v < 2**32:
                raise DeviceError(f"integer argument {v} does not fit the 32-bit integers of WebGPU shaders")
            words.append(v & 0xFFFFFFFF)
        words += [struct.unpack("<I", struct.pack("<f", float(f)))[0] for f in floats]
        words += grid
        if total >= 2**31:
            raise DeviceError(f"the grid has {total} blocks; WebGPU shaders index blocks with 32-bit integers")
        words += [0] * (self.arg_words - len(words))
        args = self._buffer("args", 4 * self.arg_words, wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST)
        self.dev.queue.write_buffer(args, 0, struct.pack(f"<{self.arg_words}I", *words))
        gpu_bufs, sizes, on_host = [], [], []
        for k, (addr, b) in enumerate(zip(buffers, self.buffers)):
            n = nbytes[k]
            t = resident(addr)
            if t is not None:  # already on the GPU: bind its buffer, no copy
                if t.gpu_device is not self.dev:
                    raise DeviceError(f"argument {b['name']!r} lives on another WebGPU device ({t.device}) than "
                                      "this kernel's; make it with to_device(..., target=<this kernel's target>)")
                gpu_bufs.append(t.gpu_buffer)
                sizes.append(n)
                on_host.append(False)
                continue
            padded = max(4, (n + 3) // 4 * 4)
            buf = self._buffer(k, padded, usage)
            if n:
                host = (ctypes.c_char * n).from_address(addr)
                data = bytes(host) if n == padded else bytes(host) + b"\0" * (padded - n)
                self.dev.queue.write_buffer(buf, 0, data)
                count_transfer("upload", n)
            gpu_bufs.append(buf)
            sizes.append(n)
            on_host.append(True)
        key = tuple(id(b) for b in gpu_bufs)
        hit = self.groups.get(key)
        if hit is None:
            entries = [{"binding": 0, "resource": {"buffer": args, "offset": 0, "size": 4 * self.arg_words}}]
            entries += [{"binding": k + 1, "resource": {"buffer": b, "offset": 0, "size": b.size}}
                        for k, b in enumerate(gpu_bufs + ([self.fault] if self.fault else []))]
            if len(self.groups) >= MAX_BIND_GROUPS:  # resident tensors come and go: do not pin them all
                self.groups.clear()
            # the entry keeps its buffers alive, so their ids (the key) cannot be reused while it exists
            hit = self.groups[key] = (self.dev.create_bind_group(layout=self.bgl, entries=entries), gpu_bufs)
        group = hit[0]
        if self.fault:
            self.dev.queue.write_buffer(self.fault, 0, bytes(self.fault_bytes))
        enc = self.dev.create_command_encoder()
        desc = {}
        if self.timestamps:
            desc["timestamp_writes"] = {"query_set": self.qset, "beginning_of_pass_write_index": 0,
                                        "end_of_pass_write_index": 1}
        cp = enc.begin_compute_pass(**desc)
        cp.set_pipeline(self.pipe)
        cp.set_bind_group(0, group)
        cp.dispatch_workgroups(*self._dispatch_dims(total))
        cp.end()
        if self.timestamps:
            enc.resolve_query_set(self.qset, 0, 2, self.qbuf, 0)
        self.dev.queue.submit([enc.finish()])
        self.pending = True
        for k, (addr, b) in enumerate(zip(buffers, self.buffers)):
            if b.get("written") and sizes[k] and on_host[k]:
                data = self.dev.queue.read_buffer(gpu_bufs[k], 0, gpu_bufs[k].size)
                ctypes.memmove(addr, bytes(data[:sizes[k]]), sizes[k])
                count_transfer("download", sizes[k])
                self.pending = False
        if self.timestamps:
            t0, t1 = struct.unpack("<QQ", bytes(self.dev.queue.read_buffer(self.qbuf, 0, 16)))
            DEVICE_CLOCK.add(t1 - t0)
            self.pending = False
        if self.fault:  # a kernel with assertions waits for its end and reports the first failure
            words = struct.unpack(f"<{self.fault_bytes // 4}i", bytes(self.dev.queue.read_buffer(self.fault, 0)))
            self.pending = False
            if words[0]:
                raise self.asserts.failure(words[0], words[1:])


__all__ = ["WebGPURuntime", "WebGPUProgram", "adapters", "adapter_info", "select_adapter", "device_for",
           "wgpu_version", "DEVICE_CLOCK", "TRANSFERS", "has_subgroups"]
