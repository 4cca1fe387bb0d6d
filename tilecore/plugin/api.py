"""What a backend plugin supplies: the contracts of :class:`Backend`, :class:`Runtime` and friends.

A backend wheel subclasses :class:`Backend` and returns an instance from its ``tilecore_backends``
hook. Everything vendor-specific lives behind these methods; the core calls nothing else. Methods
with a default are optional. See docs/plugin-guide.md for a walk-through.
"""
from __future__ import annotations

import abc
import importlib.metadata
import importlib.resources
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

#: The plugin API this tilecore provides: (major, minor). A backend declaring major M.m loads when
#: M equals our major and m <= our minor (minor versions only add). 1.1 adds :meth:`Backend.matrix_units`;
#: 1.2 adds :meth:`Backend.op_extensions` (extra keyword arguments of core ops that a backend accepts);
#: 1.3 adds :meth:`Program.fast_call` (a whole kernel call, binding and launch, done natively), the capability
#: value ``execution.simd_width: dynamic`` and the IR node it brings to emitters,
#: :class:`~tilecore.ir.ShuffleWidth` (``shuffle_width_expr`` of the C-family emitters); 1.4 adds matrix units
#: that read their operands from shared memory themselves and run asynchronously (decision D26); 1.5 adds the
#: capability feature ``shuffle_index`` and the IR node it brings to emitters, :class:`~tilecore.ir.ShuffleIndex`
#: (``shuffle_index`` of the C-family emitters); 1.6 bulk tile copies; 1.7 ``performance_notes``; 1.8 adds
#: :attr:`~tilecore.ir.BulkCopy.when` (a bulk copy of a loop versioned at launch on its tensor's row length);
#: 1.9 adds bulk tile stores (:class:`~tilecore.ir.BulkStore`, :class:`~tilecore.ir.BulkStoreWait`,
#: :class:`~tilecore.ir.BulkFence`: ``tilecore.bulk_store``, decision D46); 1.10 adds
#: :class:`~tilecore.ir.MatrixStore` (four 8x8 matrices of a 32-thread group's registers into shared memory as one
#: instruction; an emitter saying ``matrix_stores = True`` spells it: ``tilecore.matrix_stores``, decision D51);
#: 1.11 ping-pong turns (:class:`~tilecore.ir.Turn`, D55); 1.12 adds an atomic whose old value is an expression
#: (:class:`~tilecore.ir.AtomicRet`) and :class:`~tilecore.ir.Fence` (D69), block groups
#: (``KernelLaunch.attrs["block_group"]``, :class:`~tilecore.ir.GroupBarrier`, :class:`~tilecore.ir.PeerStore`, D75)
#: for emitters that spell them, and a pass's defaults beside the user's configs
#: (:meth:`~tilecore.passes.PassContext.set_defaults`, D73) with one reader of switch-like configs
#: (:meth:`~tilecore.passes.PassContext.switch`); 1.13 adds two defaults a backend would otherwise write itself:
#: :meth:`Backend.capability_files` reads the YAML of its package's ``capabilities/`` folder, and
#: :meth:`Backend.arch_of` parses ``"<name>"`` / ``"<name>:<arch>"`` target strings with aliases.
PLUGIN_API = (1, 13)

MODES = ("device", "emulated", "compile-only", "codegen-only")


@dataclass(frozen=True)
class Target:
    """A parsed target such as ``cpu`` or ``acme:x1``: which backend owns it and which profile applies."""

    backend: str
    kind: str
    arch: str = ""
    options: tuple = ()
    capability_id: str = ""

    def __str__(self) -> str:
        return f"{self.kind}:{self.arch}" if self.arch else self.kind


@dataclass(frozen=True)
class DeviceInfo:
    name: str
    index: int = 0
    properties: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Probe:
    """What :meth:`Backend.probe` found on this machine.

    ``status`` is ``ok`` (kernels can run here: on a device, or in the backend's emulator, which then
    names its emulated device in ``devices`` and has ``Runtime.mode()`` say ``emulated``), ``no-device``
    (the toolchain works but there is nothing to run on) or ``no-toolchain``; ``capabilities`` are probed values to compare with the declared
    profile (dotted-path nested dicts, as in the capability files).
    """

    status: str
    devices: tuple = ()
    capabilities: dict = field(default_factory=dict)
    detail: str = ""
    toolchain: str = ""


@dataclass(frozen=True)
class Source:
    """Generated device code. ``entry`` is the function the runtime launches; ``meta`` is free-form
    (e.g. several entries for a target that splits a kernel over separate compute units)."""

    code: str
    lang: str
    entry: str
    meta: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Intrinsic:
    """One way to lower a tile op, chosen by capability.

    Tile-op lowering picks, for each op, the highest-``priority`` entry whose ``requires`` (capability
    need strings such as ``feature:async_copy`` or ``dtype:float16:mma``) are all satisfied and whose
    ``applies(op, ctx)`` accepts the operands. ``lower(op, ctx)`` returns the replacement statement.
    """

    op: str
    name: str
    lower: Callable
    requires: tuple = ()
    priority: int = 0
    applies: Callable | None = None


@dataclass(frozen=True)
class OpExtension:
    """An extra keyword argument of a core language construct that one backend accepts (plugin API 1.2).

    ``op`` is the construct (``"copy"`` for ``T.copy``, ``"Kernel"`` for ``T.Kernel``), ``name`` the keyword,
    ``types`` the Python types its value may have, ``doc`` one line saying what it does on this backend.
    The core records such keywords on the op (``attrs["extensions"]``) and refuses them, at the user's line,
    on a target whose backend does not declare them; the backend's passes read them from the op.
    """

    op: str
    name: str
    doc: str
    types: tuple = (bool,)


#: the language constructs whose keyword arguments a backend may extend (``OpExtension.op``)
EXTENSIBLE_OPS = ("copy", "Kernel")


@dataclass(frozen=True)
class PassSpec:
    """A plugin pass placed in a pipeline slot, before or after the core's passes of that slot."""

    slot: str
    pass_: Any
    position: str = "before"


class Program(abc.ABC):
    """A loaded kernel binary."""

    @abc.abstractmethod
    def launch(self, buffers: list, ints: list, floats: list) -> None:
        """Run the kernel. ``buffers`` are device addresses (ints) in parameter order; ``ints`` the
        integer scalars (integer parameters, then shape symbols); ``floats`` the float parameters.
        Raises :class:`~tilecore.errors.KernelAssertionError` when a device assertion failed."""

    def synchronize(self) -> None:
        """Wait until launched work has finished (no-op for synchronous runtimes)."""

    def fast_call(self, signature: dict) -> Callable | None:
        """A callable doing a whole kernel call, binding and launch, or None (the default: every call
        binds in Python and calls :meth:`launch`). Plugin API 1.3.

        Called once per kernel, before its first call. The callable gets the tuple of the caller's
        arguments and returns what the kernel call returns (None, the one output, or the list of
        outputs), or ``NotImplemented`` having launched nothing, for any argument it does not take;
        the kernel then binds through the general path, whose errors the user sees. So it must never
        raise for a bad argument. :func:`tilecore.runtime.clauncher.make_launcher` builds one in C for
        drivers whose launch function has the common driver-API shape.
        .. versionadded:: 1.3
        """
        return None


class Compiler(abc.ABC):
    """The toolchain half of a runtime (the compiler/driver split): generated source in, a binary out,
    with nothing of a device needed. Optional: a backend may compile inside :meth:`Runtime.build`
    instead; one that has a Compiler lets ``build`` delegate to it, so the toolchain can be selected,
    versioned and tested on machines without the device."""

    @abc.abstractmethod
    def compile(self, source: Source, options: dict) -> bytes:
        """Compile ``source`` into a binary. Raises CompileError with the compiler's message."""

    def version(self) -> str:
        """The toolchain's identity ('' when none is usable here)."""
        return ""


class Runtime(abc.ABC):
    """Compiles generated source into a binary (itself or through a :class:`Compiler`) and loads it.
    One instance per target."""

    #: Where tensors passed to this runtime's kernels must live (torch device type, e.g. ``"cpu"``).
    tensor_device: ClassVar[str] = "cpu"

    @abc.abstractmethod
    def build(self, source: Source, options: dict) -> bytes:
        """Compile ``source`` into a binary. Raises CompileError with the compiler's message."""

    @abc.abstractmethod
    def load(self, binary: bytes, source: Source) -> Program:
        """Load a binary produced by :meth:`build` (possibly on another machine)."""

    def mode(self) -> str:
        """The highest execution mode available here: one of :data:`MODES`."""
        return "device"

    def timer(self) -> Callable[[], float]:
        """A clock in seconds that measures device time after :meth:`Program.synchronize`."""
        import time

        return time.perf_counter


class Emitter(abc.ABC):
    """Turns a lowered kernel (no tile ops left) into source text."""

    @abc.abstractmethod
    def emit(self, func, ctx) -> Source: ...


class Backend(abc.ABC):
    """A backend: targets, capability files, intrinsics, passes, codegen and runtime of one vendor."""

    #: short unique name (also the target kind prefix users type)
    name: ClassVar[str]
    #: the plugin API version this backend was written for, "major.minor"
    plugin_api: ClassVar[str] = "1.0"
    #: the distribution (wheel) that ships it; used for versions in listings and cache keys
    distribution: ClassVar[str] = ""

    def version(self) -> str:
        try:
            return importlib.metadata.version(self.distribution) if self.distribution else "0"
        except importlib.metadata.PackageNotFoundError:
            return "0+unknown"

    @abc.abstractmethod
    def parse_target(self, spec: str) -> Target | None:
        """Return the Target for a user's target string if this backend owns it, else None."""

    def targets(self) -> list:
        """Target strings this backend offers, for ``tilecore targets list``."""
        return [self.name]

    def capability_files(self) -> list:
        """Capability YAML files (paths) this backend's wheel carries: by default (API 1.13) the ``*.yaml`` files
        of the ``capabilities/`` folder in the backend class's top-level package, sorted; none without the folder."""
        package = type(self).__module__.partition(".")[0]
        try:
            root = Path(str(importlib.resources.files(package).joinpath("capabilities")))
        except (ModuleNotFoundError, TypeError):  # a class defined in __main__ or a namespace-less module
            return []
        return sorted(root.glob("*.yaml")) if root.is_dir() else []

    def arch_of(self, spec: str, archs, aliases=None, local=None) -> str | None:
        """The architecture a target string names for this backend (API 1.13), or None where it is not ours:
        ``"<name>"`` alone is ``local()`` (the machine's own, or the backend's default; None refuses the bare
        name), ``"<name>:<arch>"`` is ``arch`` (lowercase, through ``aliases``) when ``archs`` holds it."""
        text = spec.strip().lower()
        if text == self.name:
            return local() if local is not None else None
        kind, colon, arch = text.partition(":")
        if kind != self.name or not colon:
            return None
        arch = (aliases or {}).get(arch, arch)
        return arch if arch in archs else None

    def probe(self) -> Probe:
        """Look for devices and toolchains. Cheap, and never raises for a missing device."""
        return Probe("no-device")

    def intrinsics(self, target: Target) -> list:
        """Intrinsic table entries for ``target`` (the core's generic lowerings are always there)."""
        return []

    def passes(self, target: Target) -> list:
        """PassSpecs this backend adds to the pipeline for ``target``."""
        return []

    def matrix_units(self, target: Target) -> list:
        """The :class:`~tilecore.layout.MatrixUnit` s of ``target`` (plugin API 1.1): each unit's operand and
        accumulator layouts and the spelling its emitter expands. The core uses those the capability profile
        lists under ``matrix_units`` (``ctx.matrix_units``)."""
        return []

    def op_extensions(self, target: Target) -> list:
        """The :class:`OpExtension` s this backend accepts for ``target`` (plugin API 1.2): extra keyword
        arguments of ``T.copy`` / ``T.Kernel`` (e.g. a vendor's copy-path switch). Other backends refuse them."""
        return []

    @abc.abstractmethod
    def emitter(self, target: Target) -> Emitter: ...

    @abc.abstractmethod
    def runtime(self, target: Target) -> Runtime: ...

    def toolchain_version(self, target: Target) -> str:
        """Compiler identity for the kernel cache key (changes invalidate cached binaries)."""
        return ""


def capability_paths(directory: Path) -> list:
    return sorted(p for p in Path(directory).rglob("*.yaml") if p.name != "schema.yaml")
