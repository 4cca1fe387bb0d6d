"""A structural check of generated MSL that no compiler here performs: the kernel's bindings.

Metal binds buffers by the index in ``[[buffer(n)]]``; two parameters with one index, or a gap, compile
on Apple's compiler only to bind the wrong buffer (or fail at pipeline creation on the Mac). The lint reads
the kernel signature of an MSL source and reports, for the ``buffer`` (and ``texture``/``sampler``)
attribute spaces: duplicate indices, missing indices (the used set must be ``0 .. n-1``), indices past the
profile's ``limits.max_buffer_arguments``, parameters in the device or constant address spaces without a
binding, and attributes it does not know. The runtime runs it in ``build`` (a codegen-only target's
structural check); the tests run it on every conformance kernel and on mutated sources.
"""
from __future__ import annotations

import re

#: parameter attributes a compute kernel may carry (MSL specification, "Attributes for kernel function
#: input arguments"), besides the resource bindings
KNOWN = {"threadgroup_position_in_grid", "thread_position_in_threadgroup", "thread_index_in_threadgroup",
         "thread_position_in_grid", "threads_per_threadgroup", "threadgroups_per_grid", "threads_per_grid",
         "simdgroup_index_in_threadgroup", "thread_index_in_simdgroup", "threads_per_simdgroup",
         "simdgroups_per_threadgroup", "dispatch_threads_per_threadgroup", "grid_origin", "grid_size"}
RESOURCES = ("buffer", "texture", "sampler", "threadgroup")
_SIG = re.compile(r"\[\[\s*kernel\b[^\]]*\]\]\s*void\s+(\w+)\s*\((.*?)\)\s*\{|\bkernel\s+void\s+(\w+)\s*\((.*?)\)\s*\{",
                  re.S)
_ATTR = re.compile(r"\[\[\s*(\w+)\s*(?:\(\s*([^)]*)\s*\))?\s*\]\]")


def _params(text: str) -> list:
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch in "(<[":
            depth += 1
        elif ch in ")>]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def check_bindings(code: str, max_buffers: int | None = None) -> list:
    """Problems with the kernel signatures' bindings in ``code`` (empty: none found)."""
    problems = []
    kernels = _SIG.findall(code)
    if not kernels:
        return ["no kernel function found (expected `[[kernel]] void name(...)` or `kernel void name(...)`)"]
    for m in kernels:
        name, params = (m[0], m[1]) if m[0] else (m[2], m[3])
        used: dict = {r: {} for r in RESOURCES}
        for p in _params(params):
            attrs = _ATTR.findall(p)
            if not attrs:
                if re.match(r"\s*(const\s+)?(device|constant)\b", p):
                    problems.append(f"{name}: parameter `{p}` is in the {p.split()[0]} address space but has no "
                                    "[[buffer(n)]] binding")
                else:
                    problems.append(f"{name}: parameter `{p}` has no attribute (Metal cannot bind it)")
                continue
            for attr, arg in attrs:
                if attr in RESOURCES:
                    if not arg.strip().isdigit():
                        problems.append(f"{name}: [[{attr}({arg})]] needs a constant index")
                        continue
                    k = int(arg)
                    if k in used[attr]:
                        problems.append(f"{name}: [[{attr}({k})]] is bound twice (`{used[attr][k]}` and `{p}`)")
                    used[attr][k] = p
                elif attr not in KNOWN:
                    problems.append(f"{name}: unknown parameter attribute [[{attr}]] on `{p}`")
        for attr, got in used.items():
            if not got:
                continue
            missing = sorted(set(range(max(got) + 1)) - set(got))
            if missing:
                problems.append(f"{name}: [[{attr}(n)]] indices {missing} are missing (used: {sorted(got)})")
        if max_buffers is not None and used["buffer"] and max(used["buffer"]) >= max_buffers:
            problems.append(f"{name}: [[buffer({max(used['buffer'])})]] is past the {max_buffers} buffer "
                            "bindings a Metal kernel has")
    return problems
