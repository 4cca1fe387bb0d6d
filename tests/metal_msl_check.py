"""Check generated MSL with clang against the tests' ``metal_stdlib`` stand-in (tests/metal_shim).

No Metal compiler exists off macOS. MSL is C++ (14, with address spaces and attributes), so clang in C++
mode with a header that declares the Metal standard library as the specification writes it checks the
types, arity and names of every call, and, in the second pass (``address_spaces=True``), that pointers
stay in their address space (``device`` / ``constant`` / ``threadgroup`` are clang address spaces 1 / 2 /
3 there) and that no automatic variable lives in device or constant memory. Unknown attributes
(``[[buffer(n)]]`` and friends) are ignored by clang: ``tilecore_metal.lint`` checks those.

Many kernels are checked in one clang run: each source goes into its own namespace behind a ``#line``
directive naming it, so an error names the kernel it is in.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

SHIM = Path(__file__).parent / "metal_shim"
#: kernel-scope threadgroup variables (`threadgroup T name[n];`): `static` in the address-space pass
_TG_DECL = re.compile(r"^(\s+)threadgroup (\w+ \w+(?:\[\d+\])?;)", re.M)


def clang() -> str | None:
    return shutil.which("clang++-22") or shutil.which("clang++")


def _unit(code: str, address_spaces: bool) -> str:
    code = code.replace("#include <metal_stdlib>\n", "").replace("using namespace metal;\n", "")
    if address_spaces:
        code = _TG_DECL.sub(r"\1static threadgroup \2", code)
    return code


def check(sources: dict, address_spaces: bool = False) -> dict:
    """``{name: clang's errors}`` for the sources (``{name: MSL text}``) clang rejects; {} when all pass."""
    if not sources:
        return {}
    if clang() is None:
        raise RuntimeError("no clang++ here to check MSL with: apt-get install clang-22 (scripts/setup.sh does)")
    parts = ["#include <metal_stdlib>\nusing namespace metal;\n"]
    for k, (name, code) in enumerate(sources.items()):
        safe = re.sub(r"[^\w./-]", "_", name)
        parts.append(f'namespace tc_case_{k} {{\n#line 1 "{safe}"\n{_unit(code, address_spaces)}\n}}\n')
    cmd = [clang(), "-x", "c++", "-std=c++17", "-fsyntax-only", "-ferror-limit=0", "-Wno-unknown-attributes",
           "-Wno-ignored-attributes", "-Wno-c++11-narrowing", f"-I{SHIM}"]
    if address_spaces:
        cmd.append("-DTC_METAL_AS")
    with tempfile.TemporaryDirectory(prefix="tc-msl-") as d:
        path = Path(d) / "kernels.metal.cpp"
        path.write_text("".join(parts))
        proc = subprocess.run([*cmd, str(path)], capture_output=True, text=True)
    if proc.returncode == 0:
        return {}
    names = {re.sub(r"[^\w./-]", "_", n): n for n in sources}
    out: dict = {}
    for line in proc.stderr.splitlines():
        m = re.match(r"^([^:]+):\d+:\d+: (?:fatal )?error: ", line)
        if m:
            who = names.get(m.group(1), m.group(1))
            out.setdefault(who, []).append(line)
    if not out:  # an error outside any kernel (the shim itself)
        out["<shim>"] = proc.stderr.splitlines()[:20]
    return {k: "\n".join(v) for k, v in out.items()}
