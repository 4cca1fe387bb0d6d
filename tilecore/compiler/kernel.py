"""Compiled kernels: call them, inspect them, time them, save them, load them elsewhere.

Loading a kernel (from the cache or from an exported file) needs only the backend's runtime: no
parser, no passes, no compiler.
"""
from __future__ import annotations

import json
import zipfile
from pathlib import Path

from ..errors import CacheError
from ..plugin import Source, get_registry
from .binding import bind, compile_binder

EXPORT_FORMAT = 1


class JITKernel:
    """A compiled kernel. Call it with tensors: ``out = kernel(A, B)``.

    Parameters named in ``out_idx`` are allocated by the call and returned (one tensor, or a list when
    there are several); the others are passed in order.
    """

    def __init__(self, meta: dict, binary: bytes, backend, target, func=None):
        self.meta = meta
        self.binary = binary
        self.backend = backend
        self.target = target
        self.func = func
        self._program = None
        self._runtime = None
        self._launch = None   # (program.launch, the fast binder or None), made by the first call
        self._native = None   # the program's fast_call (binding and launch natively), made by the first call
        self.config = meta.get("config")
        self.latency = None

    # -- inspection ---------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.meta["name"]

    @property
    def signature(self) -> dict:
        return self.meta["signature"]

    @property
    def out_idx(self) -> list:
        return list(self.meta["signature"]["out_idx"])

    @property
    def mode(self) -> str:
        """How this kernel runs here: device, emulated, compile-only or codegen-only."""
        return self.runtime.mode()

    @property
    def source(self) -> Source:
        s = self.meta["source"]
        return Source(s["code"], s["lang"], s["entry"], s.get("meta", {}))

    @property
    def compile_times(self) -> dict:
        """Seconds per phase of the ``tilecore.compile`` that made this kernel (``plugins``, ``capabilities``,
        ``toolchain``, ``key``, and for a kernel not loaded from the cache ``passes``, ``codegen``, ``build``:
        the backend's device compiler, ``store``); empty for a kernel from :func:`load_kernel`."""
        return dict(self.meta.get("compile_times", {}))

    def get_kernel_source(self) -> str:
        return self.meta["source"]["code"]

    def get_ir(self) -> str:
        return self.meta.get("ir", "")

    def __repr__(self) -> str:
        return f"<JITKernel {self.name} target={self.target} from_cache={self.meta.get('from_cache', False)}>"

    # -- running ------------------------------------------------------------------------------------
    @property
    def runtime(self):
        if self._runtime is None:
            self._runtime = self.backend.runtime(self.target)
        return self._runtime

    def _load(self):
        if self._program is None:
            self._program = self.runtime.load(self.binary, self.source)
        return self._program

    def __call__(self, *args):
        native = self._native
        if native is not None:
            r = native(args)
            if r is not NotImplemented:
                return r
        fast = self._launch
        if fast is None:
            program = self._load()
            fast = self._launch = (program.launch,
                                   compile_binder(self.meta["signature"], self.runtime.tensor_device))
            # asked once; this first call still takes the Python path, whose launch lets the program learn its
            # device (and tell its native path) before any native call
            native = getattr(program, "fast_call", None)  # Program has it from plugin API 1.3
            self._native = native(self.meta["signature"]) if native is not None else None
        launch, binder = fast
        b = binder(args) if binder is not None else None
        if b is None:  # anything but the common case: the general binder (and its errors)
            b = bind(self.meta["signature"], args, self.name, self.runtime.tensor_device, self.backend.name)
        launch(b.buffers, b.ints, b.floats)
        if not b.outputs:
            return None
        return b.outputs[0] if len(b.outputs) == 1 else b.outputs

    def get_profiler(self, tensor_supply_type=None):
        from ..runtime.profiler import Profiler

        return Profiler(self, tensor_supply_type)

    # -- saving -------------------------------------------------------------------------------------
    def export(self, path) -> Path:
        """Write the kernel (binary, source, signature, target) to one file for :func:`load_kernel`."""
        path = Path(path)
        info = {"format": EXPORT_FORMAT, "backend": self.backend.name, "backend_version": self.backend.version(),
                "target": {"backend": self.target.backend, "kind": self.target.kind, "arch": self.target.arch,
                           "options": list(self.target.options), "capability_id": self.target.capability_id},
                "meta": {k: v for k, v in self.meta.items() if k not in ("from_cache", "compile_times")}}
        tmp = path.with_name(path.name + ".tmp")
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as z:
            z.writestr("kernel.json", json.dumps(info, sort_keys=True, default=str))
            z.writestr("binary.bin", self.binary)
            z.writestr(f"source.{self.meta['source']['lang']}", self.meta["source"]["code"])
        tmp.replace(path)
        return path


def load_kernel(path) -> JITKernel:
    """Load a kernel written by :meth:`JITKernel.export`; needs its backend installed, not a compiler.

    The file holds native code that runs in this process: load only files you trust."""
    from ..plugin import Target

    path = Path(path)
    try:
        with zipfile.ZipFile(path) as z:
            info = json.loads(z.read("kernel.json"))
            binary = z.read("binary.bin")
    except (OSError, KeyError, zipfile.BadZipFile, json.JSONDecodeError) as e:
        raise CacheError(f"{path} is not a tilecore kernel file ({e}); write one with kernel.export(path)") from None
    if info.get("format") != EXPORT_FORMAT:
        raise CacheError(f"{path} has kernel file format {info.get('format')}, this tilecore reads {EXPORT_FORMAT}")
    backends = get_registry().backends()
    backend = backends.get(info["backend"])
    if backend is None:
        raise CacheError(f"{path} was compiled for backend {info['backend']!r} (version {info['backend_version']}), "
                         f"which is not installed here; install tilecore-{info['backend']}")
    t = info["target"]
    target = Target(t["backend"], t["kind"], t["arch"], tuple(tuple(o) for o in t["options"]), t["capability_id"])
    return JITKernel(info["meta"], binary, backend, target)
