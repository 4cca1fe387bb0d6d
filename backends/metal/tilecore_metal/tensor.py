"""torch ``mps`` tensors as kernel arguments, without a copy.

``tilecore_metal.mps(t)`` wraps a contiguous torch tensor on the ``mps`` device. The wrapper follows
tilecore's device-buffer protocol (``__tilecore_buffer__``: a handle, shape, dtype, backend), so a Metal
kernel binds the tensor's own Metal buffer instead of copying through host memory: PyTorch's MPS
allocator keeps each storage in one ``MTLBuffer`` and its storage pointer is that buffer's object
(``getMTLBufferStorage`` in PyTorch's MPS backend); the element offset is the tensor's storage offset. A
launch waits for torch's queued MPS work first (``torch.mps.synchronize``) and for its own command buffer
after, so torch may read the result right away. Host tensors (numpy, CPU torch) keep working: they are
copied into shared-storage buffers and back.
"""
from __future__ import annotations

import itertools
import threading

_LOCK = threading.Lock()
_LIVE: dict = {}
_IDS = itertools.count(1 << 48)  # handles far from host addresses


class MPSTensor:
    """A torch ``mps`` tensor handed to Metal kernels by its buffer (see the module docstring)."""

    def __init__(self, tensor):
        is_torch = type(tensor).__module__.startswith("torch")
        if not is_torch or tensor.device.type != "mps":
            raise ValueError(f"tilecore_metal.mps() takes a torch tensor on the 'mps' device, got "
                             f"{tensor.device if is_torch else type(tensor).__name__}")
        if not tensor.is_contiguous():
            raise ValueError("tilecore_metal.mps() needs a contiguous tensor: pass t.contiguous()")
        from tilecore.compiler.binding import dtype_name

        self.tensor = tensor
        self.dtype = dtype_name(tensor)
        self.shape = tuple(tensor.shape)
        with _LOCK:
            self.handle = next(_IDS)
            _LIVE[self.handle] = self

    def __del__(self):
        with _LOCK:
            _LIVE.pop(getattr(self, "handle", None), None)

    @staticmethod
    def __tilecore_buffer__(x) -> dict:
        return {"handle": x.handle, "shape": x.shape, "dtype": x.dtype, "backend": "metal"}

    def metal_buffer(self):
        """``(MTLBuffer, byte offset)`` of the tensor's storage."""
        import objc  # noqa: PLC0415 - macOS only

        t = self.tensor
        buf = objc.objc_object(c_void_p=t.untyped_storage().data_ptr())
        return buf, t.storage_offset() * t.element_size()


def mps(tensor) -> MPSTensor:
    """Pass ``tensor`` (torch, on ``mps``) to Metal kernels without copying it."""
    return MPSTensor(tensor)


def resolve(handle: int):
    """The :class:`MPSTensor` of a handle a launch received, or None (a host address)."""
    return _LIVE.get(handle)
