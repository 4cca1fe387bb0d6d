"""Tensors that stay on the GPU between launches.

``to_device(x)`` copies a numpy array or CPU torch tensor into a WebGPU storage buffer once and
returns a :class:`DeviceTensor`; ``empty(shape, dtype)`` makes one without any copy. Kernels compiled
for a ``webgpu`` target take it like a host tensor and bind its buffer without copying; what they
write into it stays on the GPU; ``.numpy()`` and ``.torch()`` read it back.

It reaches the runtime through the core's device-buffer protocol (``__tilecore_buffer__``, see
``tilecore.compiler.binding.device_buffer``): argument binding checks its shape and dtype and passes
its handle, which the runtime resolves to the GPU buffer. It has no host copy of its values, so it
does not pretend to be an array: indexing it or converting it with ``np.asarray`` is refused.
"""
from __future__ import annotations

import itertools

import numpy as np

from .runtime import adapter_info, count_transfer, device_for, register_resident, select_adapter, wgpu_module

_HANDLES = itertools.count(1)  # small integers: never a host address (those are far above the null page)


def _device_of(target: str):
    """The adapter and device of a ``webgpu`` / ``webgpu:<adapter>`` target string."""
    spec = target.strip()
    if spec.lower() != "webgpu" and not spec.lower().startswith("webgpu:"):
        raise ValueError(f"to_device: {target!r} is not a WebGPU target (webgpu or webgpu:<adapter>)")
    rest = spec[7:].strip() if ":" in spec else ""
    from . import PROFILES

    adapter = select_adapter("" if rest.lower() in PROFILES else rest)
    return adapter, device_for(adapter)


def _as_numpy(x) -> np.ndarray:
    if type(x).__module__.startswith("torch"):
        if x.device.type != "cpu":
            raise ValueError(f"to_device: the torch tensor is on {x.device}; move it to the CPU first")
        return np.ascontiguousarray(x.detach().numpy())
    return np.ascontiguousarray(x)


class DeviceTensor:
    """A tensor in a WebGPU buffer: ``shape``, ``dtype`` (numpy's) and ``nbytes``, ``numpy()``/``torch()``
    to read it back, ``copy_from(x)`` to overwrite it from the host."""

    def __init__(self, shape, dtype, gpu_buffer, gpu_device, device: str):
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        self.gpu_buffer, self.gpu_device, self.device = gpu_buffer, gpu_device, device
        self.handle = next(_HANDLES)
        register_resident(self, self.handle)

    def __tilecore_buffer__(self) -> dict:
        from tilecore.ir.dtypes import canonical

        return {"handle": self.handle, "shape": self.shape, "dtype": str(canonical(self.dtype)), "backend": "webgpu"}

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def _refuse(self, *args, **kwargs):
        raise TypeError(f"{self!r} holds its values on the GPU; read it back with .numpy() or .torch() first")

    __array__ = _refuse
    __getitem__ = _refuse
    __setitem__ = _refuse
    __iter__ = _refuse

    def __repr__(self) -> str:
        return f"DeviceTensor(shape={self.shape}, dtype={self.dtype}, device={self.device!r})"

    def __reduce__(self):
        raise TypeError("a DeviceTensor cannot be pickled; pickle t.numpy()")

    def numpy(self) -> np.ndarray:
        """The values, copied from the GPU into a new numpy array."""
        out = np.empty(self.shape, self.dtype)
        if self.nbytes:
            data = self.gpu_device.queue.read_buffer(self.gpu_buffer, 0, self.gpu_buffer.size)
            out.view(np.uint8).reshape(-1)[:] = np.frombuffer(data, np.uint8, count=self.nbytes)
            count_transfer("download", self.nbytes)
        return out

    def torch(self):
        """The values, copied from the GPU into a new CPU torch tensor."""
        import torch

        return torch.from_numpy(self.numpy())

    def copy_from(self, x) -> DeviceTensor:
        """Overwrite the values with ``x`` (a host array or tensor of the same shape and dtype)."""
        host = _as_numpy(x)
        if host.shape != self.shape or host.dtype != self.dtype:
            raise ValueError(f"copy_from: got {host.dtype} {host.shape}, this tensor is {self.dtype} {self.shape}")
        if self.nbytes:
            data = host.tobytes()
            self.gpu_device.queue.write_buffer(self.gpu_buffer, 0, data + b"\0" * (self.gpu_buffer.size - self.nbytes))
            count_transfer("upload", self.nbytes)
        return self


def empty(shape, dtype, target: str = "webgpu") -> DeviceTensor:
    """A zero-filled GPU tensor (no host copy): e.g. the output of a kernel that stays on the GPU."""
    adapter, dev = _device_of(target)
    wgpu = wgpu_module()
    shape = (int(shape),) if np.isscalar(shape) else tuple(int(s) for s in shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    size = max(4, (nbytes + 3) // 4 * 4)
    buf = dev.create_buffer(size=size, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST
                            | wgpu.BufferUsage.COPY_SRC)
    return DeviceTensor(shape, dtype, buf, dev, f"webgpu:{adapter_info(adapter)['name']}")


def to_device(x, target: str = "webgpu") -> DeviceTensor:
    """``x`` (numpy array or CPU torch tensor) copied once into a GPU buffer of ``target``'s adapter."""
    if isinstance(x, DeviceTensor):
        return x
    host = _as_numpy(x)
    return empty(host.shape, host.dtype, target).copy_from(host)


__all__ = ["DeviceTensor", "empty", "to_device"]
