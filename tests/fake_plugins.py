"""Fake backend plugins for the plugin tests: installed through real entry points (a .dist-info
folder on sys.path) or registered in code. They reuse the CPU backend's emitter and runtime, with a
capability profile of their own that lacks some features."""
from __future__ import annotations

import textwrap
from pathlib import Path

ACME_CAPS = textwrap.dedent("""\
    schema: tilecore.capabilities/v1
    id: acme/x1
    target: acme
    match: {arch: x1}
    execution: {simd_width: 1, max_threads_per_block: 256}
    memory: {shared: {max_bytes_per_block: 16384}, scopes: [global, shared, local, fragment]}
    dtypes:
      float32: {storage: true, arith: true, mma: true, atomic_add: false}
      float16: {storage: true, arith: true, mma: false, atomic_add: false}
      int32: {storage: true, arith: true, mma: false, atomic_add: false}
      float64: {storage: false, arith: false, mma: false, atomic_add: false}
    features: {atomics: false, shared_memory: true, printf: false, device_assert: true}
    limits:
      max_threads_per_block: {value: 256, kind: max}
      max_shared_bytes_per_block: {value: 16384, kind: max}
    provenance: {sources: ["tilecore test fixture"]}
    """)

ACME_MODULE = textwrap.dedent("""\
    from pathlib import Path
    from tilecore.plugin import Backend, Probe, Target, hookimpl
    from tilecore_cpu.codegen import CPUEmitter
    from tilecore_cpu.runtime import CPURuntime

    class AcmeBackend(Backend):
        name = "acme"
        plugin_api = "1.0"
        distribution = "tilecore-acme"

        def parse_target(self, spec):
            if spec in ("acme", "acme:x1"):
                return Target("acme", "acme", "x1", (), "acme/x1")
            return None

        def targets(self):
            return ["acme:x1"]

        def capability_files(self):
            return [Path(__file__).with_name("acme_x1.yaml")]

        def probe(self):
            return Probe("no-device", detail="acme boards are not attached here")

        def emitter(self, target):
            return CPUEmitter()

        def runtime(self, target):
            return CPURuntime()

    @hookimpl
    def tilecore_backends():
        return [AcmeBackend()]
    """)

BROKEN_MODULE = "raise RuntimeError('driver library libacme.so not found')\n"

INCOMPATIBLE_MODULE = textwrap.dedent("""\
    from tilecore.plugin import hookimpl
    from tilecore_cpu import CPUBackend

    class FutureBackend(CPUBackend):
        name = "future"
        plugin_api = "2.0"

    @hookimpl
    def tilecore_backends():
        return [FutureBackend()]
    """)

MISSPELLED_MODULE = textwrap.dedent("""\
    from tilecore.plugin import hookimpl

    @hookimpl
    def tilecore_backend():  # misspelled: the hook is tilecore_backends
        return []
    """)


def install(root: Path, plugins: dict) -> Path:
    """Write modules and a dist-info with entry points under ``root``; returns the folder for sys.path."""
    root.mkdir(parents=True, exist_ok=True)
    lines = ["[tilecore.backends]"]
    for ep_name, (module, text) in plugins.items():
        (root / f"{module}.py").write_text(text)
        lines.append(f"{ep_name} = {module}")
    (root / "acme_x1.yaml").write_text(ACME_CAPS)
    dist = root / "tilecore_fake_plugins-0.1.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tilecore-fake-plugins\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return root


WRONG_MODULE = textwrap.dedent("""\
    # A planted wrong-result backend (test-only): the CPU backend with min and max swapped.
    from tilecore.plugin import Target, hookimpl
    from tilecore_cpu import CPUBackend
    from tilecore_cpu.codegen import CPUEmitter

    class WrongEmitter(CPUEmitter):
        minmax = {"min": "tc_max({0}, {1})", "max": "tc_min({0}, {1})"}
        minmax_nan = {"min": "tc_nanmax({0}, {1})", "max": "tc_nanmin({0}, {1})"}

    class WrongBackend(CPUBackend):
        name = "wrongcpu"
        distribution = "tilecore-wrongcpu"

        def parse_target(self, spec):
            return Target("wrongcpu", "wrongcpu", "", (), "cpu/host") if spec == "wrongcpu" else None

        def targets(self):
            return ["wrongcpu"]

        def capability_files(self):
            return []

        def emitter(self, target):
            return WrongEmitter()

    @hookimpl
    def tilecore_backends():
        return [WrongBackend()]
    """)

ALL = {
    "acme": ("tc_fake_acme", ACME_MODULE),
    "broken": ("tc_fake_broken", BROKEN_MODULE),
    "future": ("tc_fake_future", INCOMPATIBLE_MODULE),
    "misspelled": ("tc_fake_misspelled", MISSPELLED_MODULE),
}


PLANTED_MODULE = textwrap.dedent("""\
    # Planted misbehaving kernels (test-only): the CPU backend, except that a kernel whose body takes a
    # maximum stores through a null pointer (SIGSEGV in native code) and one whose body takes a minimum
    # spins forever in native code (no Python signal handler can stop it).
    from tilecore.plugin import Source, Target, hookimpl
    from tilecore_cpu import CPUBackend
    from tilecore_cpu.codegen import ENTRY, CPUEmitter

    SEGFAULT = "*(volatile int *)0 = 1;"
    HANG = "for (;;) { __asm__ volatile(\\"\\"); }"

    class PlantedEmitter(CPUEmitter):
        def emit(self, func, ctx):
            src = super().emit(func, ctx)
            head, body = src.code.split(f"int {ENTRY}(", 1)
            plant = SEGFAULT if "max(" in body else HANG if "min(" in body else ""  # tc_max, tc_nanmax, ...  
            body = body.replace("{\\n", "{\\n  " + plant + "\\n", 1)
            return Source(f"{head}int {ENTRY}({body}", src.lang, src.entry, src.meta)

    class PlantedBackend(CPUBackend):
        name = "plantedcpu"
        distribution = "tilecore-plantedcpu"

        def parse_target(self, spec):
            return Target("plantedcpu", "plantedcpu", "", (), "cpu/host") if spec == "plantedcpu" else None

        def targets(self):
            return ["plantedcpu"]

        def capability_files(self):
            return []

        def emitter(self, target):
            return PlantedEmitter()

    @hookimpl
    def tilecore_backends():
        return [PlantedBackend()]
    """)
