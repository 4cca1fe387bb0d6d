"""Load and launch cubins through the CUDA driver API; building them is ``compiler.py``'s job
(:class:`~tilecore_cuda.compiler.CUDACompiler`, which ``CUDARuntime.build`` delegates to).

The driver is reached through ``libcuda`` with ctypes (the same C API ``cuda.bindings.driver`` wraps),
so loading and launching need nothing beyond the driver itself; torch supplies the tensors, the
context and the current stream.
"""
from __future__ import annotations

import ctypes
import functools
import os
import sys
import time

from tilecore.errors import MAX_FAULT_VALUES, DeviceError
from tilecore.plugin import Program, Runtime, Source
from tilecore.runtime.launch import AssertionTable, shape_fn

# the toolchain moved to compiler.py; these names stay importable from here
from .compiler import (CUDA_INCLUDE_DIRS, CUDACompiler, build_nvcc, build_nvrtc, find_nvcc,  # noqa: F401
                       nvcc_version, nvrtc_usable, nvrtc_version, toolchain)

#: the status buffer: a code word, a pad word, then MAX_FAULT_VALUES int64 values (checked mode's indices)
STATUS_WORDS = 2 + 2 * MAX_FAULT_VALUES

#: the descriptor passed for a tensor map the launch's kernel does not read (a versioned loop's other branch)
_UNUSED_MAP = (ctypes.c_ubyte * 128)()

# -- the driver ---------------------------------------------------------------------------------------


class _LaunchConfig(ctypes.Structure):
    """CUlaunchConfig (cuda.h), for cuOccupancyMaxActiveClusters: grid, block, dynamic shared bytes, stream, no
    attributes (a kernel's compiled __cluster_dims__ give the cluster)."""
    _fields_ = [("grid_x", ctypes.c_uint), ("grid_y", ctypes.c_uint), ("grid_z", ctypes.c_uint),
                ("block_x", ctypes.c_uint), ("block_y", ctypes.c_uint), ("block_z", ctypes.c_uint),
                ("shared", ctypes.c_uint), ("stream", ctypes.c_void_p), ("attrs", ctypes.c_void_p),
                ("num_attrs", ctypes.c_uint)]


class _LaunchAttribute(ctypes.Structure):
    """CUlaunchAttribute (cuda.h): the attribute's id, 4 bytes of padding, a 64-byte value (a union; the attributes
    used here read its first int)."""
    _fields_ = [("id", ctypes.c_uint), ("pad", ctypes.c_uint), ("value", ctypes.c_int * 16)]


#: CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (cuda.h): the launch may begin before the previous kernel in
#: its stream has completed; the kernel's griddepcontrol.wait waits for it (D76)
_PROGRAMMATIC_STREAM_SERIALIZATION = 6


@functools.lru_cache(maxsize=1)
def _libcuda():
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        if lib.cuInit(0) != 0:
            return None
        return lib
    return None


@functools.lru_cache(maxsize=1)
def device_count() -> int:
    lib = _libcuda()
    if lib is None:
        return 0
    n = ctypes.c_int(0)
    if lib.cuDeviceGetCount(ctypes.byref(n)) != 0:
        return 0
    return n.value


# CUdevice_attribute values (cuda.h)
_ATTR = {"max_threads_per_block": 1, "shared_per_block": 8, "sm_count": 16, "cc_major": 75, "cc_minor": 76,
         "shared_per_block_optin": 97, "shared_per_sm": 81}


def device_properties(index: int = 0) -> dict:
    lib = _libcuda()
    dev = ctypes.c_int(0)
    if lib is None or lib.cuDeviceGet(ctypes.byref(dev), index) != 0:
        return {}
    props = {}
    for key, attr in _ATTR.items():
        v = ctypes.c_int(0)
        if lib.cuDeviceGetAttribute(ctypes.byref(v), attr, dev) == 0:
            props[key] = v.value
    name = ctypes.create_string_buffer(256)
    if lib.cuDeviceGetName(name, 256, dev) == 0:
        props["name"] = name.value.decode(errors="replace")
    return props


def arch_of(props: dict) -> str:
    major, minor = props.get("cc_major", 0), props.get("cc_minor", 0)
    arch = f"sm_{major}{minor}"
    return arch + "a" if major >= 9 else arch


def runs_on(arch: str, device_arch: str) -> bool:
    """Whether a cubin built for ``arch`` loads on a device of ``device_arch`` (SASS compatibility: the same
    major version and a minor not above the device's; an ``a`` arch only on exactly that arch)."""
    def parse(a):
        digits = a.removeprefix("sm_").rstrip("a")
        return (int(digits[:-1]), int(digits[-1])) if digits.isdigit() and len(digits) >= 2 else (0, 0)

    if arch.endswith("a"):
        return arch.rstrip("a") == device_arch.rstrip("a")
    (ma, mi), (da, di) = parse(arch), parse(device_arch)
    return ma == da and mi <= di


def _err(lib, code: int) -> str:
    s = ctypes.c_char_p()
    lib.cuGetErrorString(code, ctypes.byref(s))
    return f"{code} ({s.value.decode() if s.value else 'unknown'})"


def _import_torch_first() -> None:
    """Import torch before NVRTC's libraries enter the process, on machines with a GPU.

    On the H100 test machine (torch 2.11+cu130, cuda-bindings 13.0) a first ``import torch`` after an
    NVRTC compile failed inside torch's own import (a schema parse error in torch.library, then
    "partially initialized module 'torch'" on every later use), which crashed most conformance cases.
    torch is needed there anyway to launch, so it is imported first. No effect without torch or a GPU.
    """
    if "torch" in sys.modules or device_count() == 0:
        return
    try:
        import torch  # noqa: F401
    except ImportError:
        pass


class CUDARuntime(Runtime):
    tensor_device = "cuda"

    def __init__(self, arch: str = "sm_90a"):
        self.arch = arch
        self.compiler = CUDACompiler(arch)

    def build(self, source: Source, options: dict) -> bytes:
        return self.compiler.compile(source, options)

    def load(self, binary: bytes, source: Source) -> "CUDAProgram":
        if device_count() == 0:
            raise DeviceError("no CUDA device found (the CUDA driver reports none, or libcuda is missing): this "
                              "kernel was compiled for " + (source.meta.get("arch") or self.arch)
                              + " but cannot run on this machine")
        return CUDAProgram(binary, source)

    def mode(self) -> str:
        """``device`` when a GPU here can run this target's binaries; ``compile-only`` otherwise (no GPU, or
        e.g. ``cuda:sm_80`` cubins on an sm_90 device, which SASS compatibility does not allow)."""
        if device_count() == 0:
            return "compile-only"
        return "device" if runs_on(self.arch, arch_of(device_properties(0))) else "compile-only"

    def timer(self):
        import torch

        def now() -> float:
            torch.cuda.synchronize()
            return time.perf_counter()

        return now


class CUDAProgram(Program):
    def __init__(self, binary: bytes, source: Source):
        import torch

        self.torch = torch
        self.lib = _libcuda()
        self.binary = binary
        self.entry = source.entry
        self.meta = dict(source.meta)
        self.asserts = AssertionTable(self.meta)
        self.grid_fn = shape_fn(self.meta.get("grid", ["1", "1", "1"]))
        self.threads = int(self.meta.get("threads", 128))
        self.dyn_shared = int(self.meta.get("dynamic_shared_bytes", 0))
        self.funcs: dict = {}
        self.status = None
        # a map with "when" (a versioned loop's bulk copies, D40): encoded where that launch-time test holds;
        # elsewhere the kernel takes its per-thread copies and is passed zeros in the map's place
        self.tmaps = [dict(m, dims=shape_fn(m["dims"]), when=shape_fn([m["when"]]) if m.get("when") else None)
                      for m in self.meta.get("tensor_maps", ())]
        self.tmap_cache: dict = {}
        self._maps_memo = None  # (buffer addresses, integers, descriptors) of the compiled launcher's last call
        self.aligned = list(self.meta.get("aligned_args", ()))
        # global scratch the kernel asks for (a GEMM split over K: hopper.split_k): one zero-filled buffer per
        # (device, stream), allocated at the first launch there and kept; its address is a parameter after
        # the tensor maps. The kernel leaves its counters at zero, so no launch clears it again.
        self.workspace_bytes = int((self.meta.get("workspace") or {}).get("bytes", 0))
        self._workspaces: dict = {}
        self._extra = len(self.tmaps) + (1 if self.workspace_bytes else 0)  # parameters passed by address
        env = os.environ.get("TILECORE_DEVICE")
        self._env_device = int(env) if env is not None and env.isdigit() else None
        self._cur_dev = None      # the device of the last launch (its function and status word are bound)
        self._status_by_dev: dict = {}
        self._has_asserts = bool(self.asserts)
        self._last_slots = None
        static = all(str(g).strip().isdigit() for g in self.meta.get("grid", ["1"] * 3))
        persistent = self.meta.get("hopper_persistent")
        if persistent:  # a persistent GEMM (hopper.py, D34): min(tiles, this device's SMs x blocks per SM) blocks
            sms = device_properties(self._env_device or 0).get("sm_count")
            if sms:
                tiles, cap = shape_fn([persistent["tiles"]]), int(sms) * int(persistent["blocks_per_sm"])
                cap -= cap % int(persistent.get("cluster", 1))  # clusters of two (D44): whole clusters
                self.grid_fn = lambda ints: (min(tiles(ints)[0], cap), 1, 1)
                static = str(persistent["tiles"]).strip().isdigit()
        grid = self.grid_fn([0] * 64) if static else None
        self._grid = grid  # a grid of constants: computed once, not per launch
        # the per-launch queries, bound once (torch's private fast forms where this torch has them)
        self._get_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device
        self._get_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        # called without argtypes (a prototyped ctypes call converts each argument through from_param: 1.6 us
        # instead of 0.8 us here); the grid and block sizes fit C ints, the pointers go as c_void_p
        self._cuLaunchKernel = getattr(self.lib, "cuLaunchKernel", None) if self.lib is not None else None
        self._native = None  # the compiled launcher (fast_call), told the device by _enter
        # D76: a kernel compiled with tilecore.cuda.programmatic_launch goes through cuLaunchKernelEx with the
        # programmatic stream serialization attribute (the Python path: the compiled launcher calls cuLaunchKernel)
        self._programmatic = None
        if self.meta.get("programmatic_launch"):
            ex = getattr(self.lib, "cuLaunchKernelEx", None) if self.lib is not None else None
            if ex is None:
                raise DeviceError(f"kernel {self.entry} was compiled with tilecore.cuda.programmatic_launch, but this "
                                  "CUDA driver has no cuLaunchKernelEx (CUDA 12.0 or later): compile it without")
            attr = _LaunchAttribute()
            attr.id = _PROGRAMMATIC_STREAM_SERIALIZATION
            attr.value[0] = 1
            self._programmatic = (ex, attr, _LaunchConfig())

    def _device(self) -> int:
        dev = self._get_device()
        if self._env_device is not None and dev != self._env_device:
            torch = self.torch
            torch.cuda.set_device(self._env_device)
            dev = self._env_device
        return dev

    def _function(self, dev: int):
        fn = self.funcs.get(dev)
        if fn is not None:
            return fn
        lib = self.lib
        self.torch.cuda.init()
        self.torch.empty(1, device=f"cuda:{dev}")  # makes torch create and bind the primary context
        ctx = ctypes.c_void_p()
        lib.cuCtxGetCurrent(ctypes.byref(ctx))
        if not ctx.value:
            cudev = ctypes.c_int(0)
            lib.cuDeviceGet(ctypes.byref(cudev), dev)
            rc = lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), cudev)
            if rc != 0:
                raise DeviceError(f"cuDevicePrimaryCtxRetain failed: {_err(lib, rc)}")
            lib.cuCtxSetCurrent(ctx)
        module = ctypes.c_void_p()
        buf = ctypes.create_string_buffer(self.binary, len(self.binary))
        rc = lib.cuModuleLoadData(ctypes.byref(module), buf)
        if rc != 0:
            raise DeviceError(f"cuModuleLoadData failed: {_err(lib, rc)} (was the kernel built for this GPU's "
                              f"architecture? it was built for {self.meta.get('arch')})")
        func = ctypes.c_void_p()
        rc = lib.cuModuleGetFunction(ctypes.byref(func), module, self.entry.encode())
        if rc != 0:
            raise DeviceError(f"cuModuleGetFunction failed: {_err(lib, rc)}")
        if self.dyn_shared > 48 * 1024:
            # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
            rc = lib.cuFuncSetAttribute(func, 8, ctypes.c_int(self.dyn_shared))
            if rc != 0:
                raise DeviceError(f"cannot give the kernel {self.dyn_shared} bytes of shared memory: {_err(lib, rc)}")
        self.funcs[dev] = (module, func)
        self._check_clusters(func)
        return self.funcs[dev]

    def _check_clusters(self, func) -> None:
        """A kernel compiled with ``__cluster_dims__`` (a split GEMM summed in clusters, docs/decisions.md D41)
        whose clusters do not all fit on this GPU at once runs its last ones in another wave: about twice the time.
        The driver says how many fit (cuOccupancyMaxActiveClusters); fewer than the grid has is a
        PerformanceWarning naming the fix. Said once per device load; a driver without the query says nothing."""
        cluster, grid = self.meta.get("cluster"), self._grid
        query = getattr(self.lib, "cuOccupancyMaxActiveClusters", None) if self.lib is not None else None
        if not cluster or grid is None or query is None:
            return
        size = int(cluster[0]) * int(cluster[1]) * int(cluster[2])
        need = int(grid[0]) * int(grid[1]) * int(grid[2]) // size
        cfg = _LaunchConfig(int(grid[0]), int(grid[1]), int(grid[2]), self.threads, 1, 1, self.dyn_shared, None,
                            None, 0)
        fits = ctypes.c_int(0)
        if query(ctypes.byref(fits), func, ctypes.byref(cfg)) != 0 or fits.value <= 0 or fits.value >= need:
            return
        import warnings

        from tilecore.errors import PerformanceWarning

        if self.meta.get("hopper_persistent"):  # a persistent GEMM in clusters of two (D44)
            warnings.warn(PerformanceWarning(
                f"kernel {self.entry}: this GPU holds {fits.value} clusters of {size} blocks at once, the persistent "
                f"grid has {need}: the others wait for whole clusters' tiles (about twice the time). Its clusters "
                "share TMA loads (tilecore.cuda.cluster_multicast): pass tilecore.cuda.cluster_multicast=False"),
                stacklevel=2)
            return
        if self.meta.get("group_multicast"):  # the core's persistent loop in block groups sharing copies (D80)
            warnings.warn(PerformanceWarning(
                f"kernel {self.entry}: this GPU holds {fits.value} clusters of {size} blocks at once, the persistent "
                f"grid has {need}: the others wait for whole clusters' tiles (about twice the time). Its block groups "
                "share bulk copies (tilecore.group_multicast): pass tilecore.group_multicast=False, or "
                "tilecore.persistent=<a block count the GPU holds>"), stacklevel=2)
            return
        by = list(self.meta.get("cluster_by") or ())
        head = (f"kernel {self.entry}: this GPU holds {fits.value} clusters of {size} blocks at once, the grid has "
                f"{need}: the rest run in a second wave (about twice the time). ")
        if "tilecore.split_k_reduce" in by:  # the core's split-K summed in block groups (D75, D78), maybe routed
            routed = "tilecore.cuda.general_split_k" in by
            warnings.warn(PerformanceWarning(
                head + "Its clusters are the block groups of the core's split-K sum (tilecore.split_k_reduce"
                + (", the group the plugin's split GEMM was routed to by tilecore.cuda.general_split_k): pass "
                   "tilecore.cuda.general_split_k=False (the plugin's split-K, which lowers its count where its "
                   "clusters do not fit) or fewer splits (tilecore.split_k)" if routed else
                   "=\"group\"): use fewer splits (tilecore.split_k) or tilecore.split_k_reduce=\"workspace\"")),
                stacklevel=2)
            return
        if by:  # another option's block group
            warnings.warn(PerformanceWarning(head + f"Its clusters are block groups made by {', '.join(by)}: turn "
                                             "that off"), stacklevel=2)
            return
        warnings.warn(PerformanceWarning(
            head + "Its clusters are the splits of a GEMM summed in the cluster (tilecore.cuda.split_k_reduce="
            "\"cluster\"): use fewer splits (tilecore.cuda.split_k) or tilecore.cuda.split_k_reduce=\"global\""),
            stacklevel=2)

    def _enter(self, dev: int) -> int:
        """Make ``dev`` (or $TILECORE_DEVICE) the launch device: its function and status word, loaded once."""
        dev = self._device()
        self._func = self._function(dev)[1]
        state = self._status_by_dev.get(dev)
        if state is None:
            # word 0: the first failed assertion's code; from word 2, the int64 values it recorded
            status = self.torch.zeros(STATUS_WORDS, dtype=self.torch.int32, device=f"cuda:{dev}")
            state = self._status_by_dev[dev] = (status, status.data_ptr())
        self.status, self._status_ptr = state
        self._cur_dev = dev
        if self._native is not None:
            self._native.set_device(dev, self._func.value or 0, self._status_ptr)
        return dev

    #: the torch tensor attribute that is True for tensors this program's kernels take
    tensor_flag = "is_cuda"

    def fast_call(self, signature: dict):
        """The compiled launcher (:func:`tilecore.runtime.clauncher.make_launcher`): binding and
        cuLaunchKernel in C, about 3 us of host CPU less than the Python path per 3-tensor launch. TMA
        descriptors stay encoded and cached in Python (``_tensor_map``, called by the launcher). None
        without the driver, or where the launcher cannot be built (``TILECORE_C_LAUNCHER=0``, no C
        compiler or Python headers)."""
        from tilecore.runtime.clauncher import make_launcher

        if self._cuLaunchKernel is None or self._programmatic is not None:
            return None
        address = ctypes.cast(self._cuLaunchKernel, ctypes.c_void_p).value
        raw = self._get_stream
        native = make_launcher(
            signature, device_attr=self.tensor_flag, launch_address=address, grid=self._grid or self.grid_fn,
            block=(self.threads, 1, 1), shared=self.dyn_shared, get_device=self._get_device,
            get_stream=raw if raw is not None else self._raw_stream, fail=self._launch_failed,
            after=self._check_status if self._has_asserts else None, aligned=self.aligned,
            descriptors=self._descriptors if self._extra else None, ndescriptors=self._extra)
        self._native = native
        if native is not None and self._cur_dev is not None:  # launched before: the device is known
            native.set_device(self._cur_dev, self._func.value or 0, self._status_ptr)
        return native

    def _descriptors(self, buffers, ints) -> tuple:
        """The launch's parameters passed by address: the TMA descriptors, then the workspace's address (the
        compiled launcher holds them until cuLaunchKernel returns; it launches on ``self._cur_dev``)."""
        memo = self._maps_memo  # the last launch's: a repeated launch compares two sequences (D40)
        if memo is not None and memo[0] == buffers and memo[1] == ints:
            maps = memo[2]
        else:
            maps = tuple(self._tensor_map(m, buffers[m["arg"]], ints) for m in self.tmaps)
            self._maps_memo = (buffers, ints, maps)  # (the launcher passes a fresh tuple and list each call)
        if not self.workspace_bytes:
            return maps
        dev = self._cur_dev
        return maps + (self._workspace(dev, self._raw_stream(dev)),)

    def _workspace(self, dev: int, stream: int):
        """The kernel's workspace on ``dev`` for launches on ``stream``, as the 8 bytes of its address (a ctypes
        array the launch points a parameter at). One per stream: launches on one stream run one after the
        other, so they can share it; two streams running the kernel at once must not (a tile's counter would
        count the blocks of both launches). Allocated zero-filled on first use, on that stream (inside a CUDA
        graph capture the fill is captured before the kernel)."""
        key = (dev, stream)
        hit = self._workspaces.get(key)
        if hit is None:
            torch = self.torch
            buf = torch.zeros(self.workspace_bytes, dtype=torch.uint8, device=f"cuda:{dev}")
            hit = self._workspaces[key] = (buf, (ctypes.c_uint64 * 1)(buf.data_ptr()))
        return hit[1]

    def _launch_failed(self, rc: int, grid) -> None:
        raise DeviceError(f"cuLaunchKernel failed: {_err(self.lib, rc)} (grid {tuple(grid)}, {self.threads} threads, "
                          f"{self.dyn_shared} bytes of dynamic shared memory)")

    def _check_status(self) -> None:
        """After a launch of a kernel with device asserts: read the status word back (synchronizes) and
        raise the failed assertion. Inside a CUDA graph capture nothing may synchronize: the status word
        keeps the code, and the next launch outside a capture reports it."""
        if self.torch.cuda.is_current_stream_capturing():
            return
        code = int(self.status[0].item())
        if code:
            values = self.status[2:].view(self.torch.int64).tolist()
            self.status.zero_()
            raise self.asserts.failure(code, values)

    def launch(self, buffers: list, ints: list, floats: list) -> None:
        dev = self._get_device()
        if dev != self._cur_dev:
            dev = self._enter(dev)
        grid = self._grid or self.grid_fn(ints)
        if grid[0] <= 0 or grid[1] <= 0 or grid[2] <= 0:
            return
        for i in self.aligned:
            if int(buffers[i]) % 16:
                raise DeviceError(f"argument {i}: this kernel accesses it 16 bytes at a time (cp.async, vector "
                                  f"stores) and needs it 16-byte aligned (address {int(buffers[i]):#x}); pass a fresh contiguous tensor")
        nb, ni, nf = len(buffers), len(ints), len(floats)
        last = self._last_slots  # a kernel's signature fixes the counts: the same slots every launch
        if last is None or last[0] != nb or last[1] != ni or last[2] != nf:
            last = self._last_slots = (nb, ni, nf) + self._slots(nb, ni, nf)
        _, _, _, store, dbl, params = last
        store[:nb] = buffers  # addresses and integers: one int64 slot each, written in two calls
        store[nb:nb + ni] = ints
        store[nb + ni] = self._status_ptr
        if nf:
            dbl[:] = [float(f) for f in floats]
        raw = self._get_stream
        stream = raw(dev) if raw is not None else self._raw_stream(dev)
        if self._extra:  # 128-byte descriptors, the workspace's address: point the parameters at them
            k = nb + ni + len(floats)
            # held until the launch has copied them: encoding the second may clear the cache of the first
            held = [self._tensor_map(m, int(buffers[m["arg"]]), ints) for m in self.tmaps]
            if self.workspace_bytes:
                held.append(self._workspace(dev, stream))
            for j, d in enumerate(held):
                params[k + j] = ctypes.addressof(d)
        if self._programmatic is not None:
            rc = self._launch_programmatic(grid, stream, params)
        else:
            rc = self._cuLaunchKernel(self._func, grid[0], grid[1], grid[2], self.threads, 1, 1, self.dyn_shared,
                                      ctypes.c_void_p(stream), params, None)
        if rc != 0:
            self._launch_failed(rc, grid)
        if self._has_asserts:  # synchronizes: only kernels with device asserts pay for it
            self._check_status()

    def _launch_programmatic(self, grid, stream: int, params) -> int:
        """cuLaunchKernelEx with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (D76)."""
        ex, attr, cfg = self._programmatic
        cfg.grid_x, cfg.grid_y, cfg.grid_z = int(grid[0]), int(grid[1]), int(grid[2])
        cfg.block_x, cfg.block_y, cfg.block_z = self.threads, 1, 1
        cfg.shared = self.dyn_shared
        cfg.stream = stream
        cfg.attrs = ctypes.addressof(attr)
        cfg.num_attrs = 1
        return ex(ctypes.byref(cfg), self._func, params, None)

    def _slots(self, nb: int, ni: int, nf: int):
        """The launch's argument storage (one int64 array for addresses, integers and the status word; one
        double array) and the parameter array pointing into it. ``launch`` keeps the last ones (a kernel's
        signature fixes the counts), so a launch writes the values with two slice assignments and builds no
        ctypes objects."""
        store = (ctypes.c_int64 * (nb + ni + 1))()
        dbl = (ctypes.c_double * max(nf, 1))()
        params = (ctypes.c_void_p * (nb + ni + nf + self._extra + 1))()
        base, fbase, w = ctypes.addressof(store), ctypes.addressof(dbl), 8
        for k in range(nb + ni):
            params[k] = base + w * k
        for j in range(nf):
            params[nb + ni + j] = fbase + w * j
        params[nb + ni + nf + self._extra] = base + w * (nb + ni)  # the status word's address
        return store, dbl, params

    def _raw_stream(self, dev: int) -> int:
        raw = self._get_stream
        return raw(dev) if raw is not None else self.torch.cuda.current_stream(dev).cuda_stream

    def _tensor_map(self, m: dict, ptr: int, ints: list):
        """The TMA descriptor (CUtensorMap, 128 bytes) of a row-major tensor at ``ptr``, for the kernel's box
        and swizzle; cached per (address, dims), so a launch on the same tensors encodes nothing. A map with
        ``when`` (D40) is cached per (address, the launch's integers), zeros included where its test fails."""
        when = m["when"]
        if when is not None:  # a versioned loop's map: its test reads any of the integers, so they are the key
            key = (m["arg"], ptr, tuple(ints))
            hit = self.tmap_cache.get(key)
            if hit is not None:
                return hit
            if not when(ints)[0]:  # the kernel tests the same condition and reads no map
                if len(self.tmap_cache) > 64:
                    self.tmap_cache.clear()
                self.tmap_cache[key] = _UNUSED_MAP
                return _UNUSED_MAP
            dims = m["dims"](ints)
        else:
            dims = m["dims"](ints)
            key = (m["arg"], ptr, dims)
            hit = self.tmap_cache.get(key)
            if hit is not None:
                return hit
        esize = int(m["elem_bytes"])
        strides = []
        stride = esize
        for d in dims[:-1]:
            stride *= d
            strides.append(stride)
        if ptr % 16 or any(x % 16 for x in strides):
            fix = ("pass_configs={'tilecore.bulk_copy_versioned': False}" if m["when"] is not None
                   else m.get("fix", "pass_configs={'tilecore.cuda.disable_wgmma': True}"))  # C's map: tma_store's
            raise DeviceError(f"argument {m['arg']}: the TMA copies of this kernel need a 16-byte aligned tensor whose "
                              f"rows are multiples of 16 bytes (address {ptr:#x}, row strides {strides} bytes); "
                              f"pass a fresh contiguous tensor, or compile with {fix}")
        out = (ctypes.c_ubyte * 128)()
        rank = len(dims)
        gdim = (ctypes.c_uint64 * rank)(*dims)
        gstride = (ctypes.c_uint64 * max(rank - 1, 1))(*(strides or [0]))
        box = (ctypes.c_uint32 * rank)(*[int(b) for b in m["box"]])
        estride = (ctypes.c_uint32 * rank)(*([1] * rank))
        # interleave none, swizzle (3 = 128B), L2 promotion 256B, out-of-bounds elements read as zero
        rc = self.lib.cuTensorMapEncodeTiled(out, ctypes.c_int(int(m["dtype"])), ctypes.c_uint32(rank),
                                             ctypes.c_void_p(ptr), gdim, gstride, box, estride, ctypes.c_int(0),
                                             ctypes.c_int(int(m["swizzle"])), ctypes.c_int(3), ctypes.c_int(0))
        if rc != 0:
            raise DeviceError(f"cuTensorMapEncodeTiled failed: {_err(self.lib, rc)} (dims {dims}, box {m['box']})")
        if len(self.tmap_cache) > 64:
            self.tmap_cache.clear()
        self.tmap_cache[key] = out
        return out

    def synchronize(self) -> None:
        self.torch.cuda.synchronize()

    def global_words(self, name: str, clear: bool = False):
        """The 64-bit words of the module's ``__device__`` array ``name`` on the current device (loaded by a launch
        there), as a list of ints after the device's work so far; ``clear`` zeroes them after reading. For the
        persistent GEMM's pipeline profile (``tilecore.cuda.pipeline_profile``: ``tc_pipe_prof``, docs/decisions.md
        D49), which benchmarks/cuda_gemm.py reads."""
        dev = self._device()
        module = self._function(dev)[0]
        ptr, size = ctypes.c_uint64(0), ctypes.c_size_t(0)
        rc = self.lib.cuModuleGetGlobal_v2(ctypes.byref(ptr), ctypes.byref(size), module, name.encode())
        if rc != 0:
            raise DeviceError(f"cuModuleGetGlobal({name!r}) failed: {_err(self.lib, rc)} (is the kernel compiled with "
                              "tilecore.cuda.pipeline_profile=True?)")
        self.torch.cuda.synchronize(dev)
        buf = (ctypes.c_uint64 * (size.value // 8))()
        rc = self.lib.cuMemcpyDtoH_v2(buf, ctypes.c_uint64(ptr.value), size)
        if rc == 0 and clear:
            rc = self.lib.cuMemsetD8_v2(ctypes.c_uint64(ptr.value), ctypes.c_ubyte(0), size)
            self.torch.cuda.synchronize(dev)
        if rc != 0:
            raise DeviceError(f"reading {name!r} failed: {_err(self.lib, rc)}")
        return list(buf)
