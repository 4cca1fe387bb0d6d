"""Structural checks of generated MUSA code: what can be proven about the vendor statements without a
MUSA compiler or device. Every build runs them (``compiler.py``); each rule names what it found.

- **Capability gating**: a statement family appears only where the profile declares its feature: TME
  (``__musa_tme_*``, ``MUtensorDescriptor``) needs ``bulk_tensor_copy``, ASYNC barriers (``__musa_async_*``)
  ``async_barrier``, SQMMA ``sqmma``, ``__musa_memcpy_g2s`` ``async_copy``, the QY2 atom
  (``__musa_fmma_*``) a listed ``mp22_mma`` matrix unit. So none of PH1's statements can reach QY2.
- **Warp width**: ``TC_WARP`` is the profile's ``execution.simd_width``; every ``__shfl_xor_sync`` mask and
  width fits in it, and so does every indexed ``__shfl_sync``'s width (its lane is an expression).
- **TME loads**: each ``tc_tme_load_<r>d`` in the kernel has ``2 r + 3`` arguments and sits alone in a branch
  of one issuing thread, right after ``__musa_async_add_trans(id, bytes)`` (``bytes`` = the box's bytes)
  and ``__musa_async_arrive(id)`` on its own barrier ID; after the branch every thread waits on that ID
  with its phase (``__musa_async_wait(id, tc_phase<id>)``) and flips it. Every ID is used by one load,
  initialised once (``__musa_async_init_arrival(id, 1, 0)`` by thread 0, then a block barrier, before any
  load), and ``__musa_async_bar_record`` names the highest. Each descriptor is a kernel parameter.
- **SQMMA**: one ``tc_sqmma_gemm<threads, ...>`` call per gemm lowered to it (``threads`` whole squads of
  128), and the squad routine waits for its SQMMAs (``__musa_sqmma_wait``, warpsquad_wait) after issuing
  them and before it reads the accumulators.
- **Asynchronous copies**: a kernel that issues ``tc_async_copy`` waits for them (``tc_async_wait()`` after
  the first one; in a pipelined loop the wait at the top of the loop covers the copies issued at its end).
"""
from __future__ import annotations

import re

_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int8": 1, "uint8": 1, "int16": 2,
                "uint16": 2, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8, "bool": 1}

GATED = (
    ("feature:bulk_tensor_copy", re.compile(r"__musa_tme_|\btc_tme_load_\dd\(|MUtensorDescriptor")),
    ("feature:async_barrier", re.compile(r"__musa_async_")),
    ("feature:sqmma", re.compile(r"sqmma", re.I)),
    ("feature:async_copy", re.compile(r"__musa_memcpy_g2s")),
)


def _kernel_body(code: str) -> tuple:
    """(signature, body lines) of the kernel function."""
    m = re.search(r'extern "C" __global__ void [^\n]*?tc_kernel\((.*?)\) \{\n', code, re.S)
    if not m:
        return "", []
    return m.group(1), code[m.end():].splitlines()


def _calls(code: str, name: str):
    """The top-level argument texts of every call of ``name`` in ``code`` (arguments may nest calls)."""
    for m in re.finditer(rf"\b{name}\(", code):
        depth, args, start = 1, [], m.end()
        for k in range(m.end(), len(code)):
            ch = code[k]
            if ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1
                if depth == 0:
                    args.append(code[start:k].strip())
                    break
            elif ch == "," and depth == 1:
                args.append(code[start:k].strip())
                start = k + 1
        yield args


def _has_unit(caps, family: str) -> bool:
    if caps is None:
        return True
    return any(d.get("family") == family for d in (caps.get("matrix_units", None) or []))


def check(code: str, meta: dict, caps=None) -> list:
    """Problems found in ``code`` (empty when the structure is right); ``caps`` is the target's profile."""
    problems = []
    if caps is not None:
        for need, pattern in GATED:
            if caps.satisfies(need)[0] is not True and pattern.search(code):
                problems.append(f"{pattern.search(code).group(0)!r} appears but the profile {caps.id} does not "
                                f"declare {need}")
        if not _has_unit(caps, "mp22_mma") and "__musa_fmma_" in code:
            problems.append(f"the QY2 MMA atom appears but the profile {caps.id} lists no mp22_mma matrix unit")
        warp = int(caps.get("execution.simd_width"))
        m = re.search(r"^#define TC_WARP (\d+)$", code, re.M)
        if not m or int(m.group(1)) != warp:
            problems.append(f"TC_WARP is {m.group(1) if m else 'missing'}, the profile's simd_width is {warp}")
        for sm in re.finditer(r"__shfl_xor_sync\(0xffffffffu, .*?, (\d+), (\d+)\)", code):
            mask, width = int(sm.group(1)), int(sm.group(2))
            if width > warp or mask >= width:
                problems.append(f"a lane exchange with mask {mask} and width {width} on {warp}-wide warps")
        for args in _calls(code, "__shfl_sync"):
            width = int(args[-1]) if args and args[-1].isdigit() else None
            if width is None or width > warp:
                problems.append(f"an indexed lane exchange of width {args[-1] if args else '?'} on {warp}-wide warps")
    sig, body = _kernel_body(code)
    problems += _check_tme(sig, body, meta)
    problems += _check_sqmma(code, body, meta)
    copies = [k for k, line in enumerate(body) if "tc_async_copy<" in line]
    waits = [k for k, line in enumerate(body) if line.strip() == "tc_async_wait();"]
    if copies and (not waits or waits[-1] < copies[0]):
        problems.append("asynchronous copies (tc_async_copy) are never waited for (no tc_async_wait after the first)")
    return problems


def _check_tme(sig: str, body: list, meta: dict) -> list:
    problems = []
    vendor = meta.get("vendor", {})
    descs = meta.get("tme_descriptors", [])
    loads = [k for k, line in enumerate(body) if re.search(r"\btc_tme_load_\dd\(", line)]
    if len(loads) != vendor.get("tme_loads", 0):
        problems.append(f"{len(loads)} TME loads in the kernel, {vendor.get('tme_loads', 0)} lowered")
    for k in range(len(descs)):
        if f"const MUtensorDescriptor tc_desc{k}" not in sig:
            problems.append(f"TME descriptor tc_desc{k} is not a kernel parameter")
    init_ids, first_sync = {}, None
    for k, line in enumerate(body):
        for m in re.finditer(r"__musa_async_init_arrival\((\d+), (\d+), (\d+)\);", line):
            init_ids.setdefault(int(m.group(1)), []).append((k, line))
        if first_sync is None and init_ids and line.strip() == "__syncthreads();":
            first_sync = k
    used = []
    for k in loads:
        line = body[k].strip()
        m = re.match(r"tc_tme_load_(\d)d\(tc_desc(\d+), (\d+), (.*)\);$", line)
        if not m:
            problems.append(f"TME load not in the expected form: {line}")
            continue
        rank, desc, bar = int(m.group(1)), int(m.group(2)), int(m.group(3))
        rest = _split_args(m.group(4))
        if len(rest) != 1 + 2 * rank:
            problems.append(f"tc_tme_load_{rank}d with {len(rest) + 2} arguments (expected {2 * rank + 3}): {line}")
            continue
        used.append(bar)
        prev = [body[k - 2].strip() if k >= 2 else "", body[k - 1].strip() if k >= 1 else ""]
        want_bytes = None
        if desc < len(descs):
            dims = [int(x) for x in rest[1 + rank:] if x.strip().isdigit()]
            n = _DTYPE_BYTES.get(descs[desc]["dtype"], 0)
            for d in dims:
                n *= d
            want_bytes = n
        am = re.match(r"__musa_async_add_trans\((\d+), (\d+)\);$", prev[0])
        if not am or int(am.group(1)) != bar:
            problems.append(f"TME load on barrier {bar} without __musa_async_add_trans({bar}, bytes) before it")
        elif want_bytes is not None and int(am.group(2)) != want_bytes:
            problems.append(f"barrier {bar} expects {am.group(2)} bytes, the TME box has {want_bytes}")
        if prev[1] != f"__musa_async_arrive({bar});":
            problems.append(f"TME load on barrier {bar} without __musa_async_arrive({bar}) before it")
        issue = body[k - 3].strip() if k >= 3 else ""
        after = [body[j].strip() for j in range(k + 1, min(k + 4, len(body)))]
        if not re.match(r"if \(\(\(int\)threadIdx\.x\) == \d+\) \{$", issue) or not after or after[0] != "}":
            problems.append(f"TME load on barrier {bar} is not issued by exactly one thread")
        if after[1:3] != [f"__musa_async_wait({bar}, tc_phase{bar});", f"tc_phase{bar} ^= 1;"]:
            problems.append(f"TME load on barrier {bar} is not followed by every thread's __musa_async_wait({bar}, "
                            f"tc_phase{bar}) and the phase flip")
        if bar not in init_ids:
            problems.append(f"ASYNC barrier {bar} is used but never initialised (__musa_async_init_arrival)")
        elif first_sync is None or first_sync > k or any(j > first_sync for j, _ in init_ids[bar]):
            problems.append(f"ASYNC barrier {bar} is not initialised before a block barrier that precedes its use")
    for bar in set(used):
        if used.count(bar) > 1:
            problems.append(f"ASYNC barrier {bar} is shared by {used.count(bar)} TME load sites (one each)")
        if len(init_ids.get(bar, [])) > 1:
            problems.append(f"ASYNC barrier {bar} is initialised {len(init_ids[bar])} times")
    for bar, where in init_ids.items():
        if bar not in used:
            problems.append(f"ASYNC barrier {bar} is initialised but no TME load uses it")
        if not re.match(r"if \(\(\(int\)threadIdx\.x\) == 0\) \{", where[0][1].strip()):
            problems.append(f"ASYNC barrier {bar} is initialised outside thread 0")
    if used:
        rec = [re.match(r"__musa_async_bar_record\((\d+)\);", line.strip()) for line in body]
        rec = [int(m.group(1)) for m in rec if m]
        if rec != [max(used)]:
            problems.append(f"__musa_async_bar_record names {rec or 'nothing'}, the highest barrier ID is {max(used)}")
    if sorted(set(used)) != sorted(vendor.get("async_barriers", [])):
        problems.append(f"barrier IDs used {sorted(set(used))}, allocated {vendor.get('async_barriers', [])}")
    return problems


def _check_sqmma(code: str, body: list, meta: dict) -> list:
    problems = []
    calls = [line for line in body if "tc_sqmma_gemm<" in line]
    want = meta.get("vendor", {}).get("sqmma_gemms", 0)
    if len(calls) != want:
        problems.append(f"{len(calls)} SQMMA gemm calls in the kernel, {want} lowered")
    for line in calls:
        m = re.search(r"tc_sqmma_gemm<(\d+),", line)
        if not m or int(m.group(1)) % 128:
            problems.append(f"SQMMA gemm in a block that is not whole 4-warp squads: {line.strip()}")
    if calls:
        m = re.search(r"void tc_sqmma_gemm\(.*?\n\}\n", code, re.S)
        text = m.group(0) if m else ""
        issue, wait = text.find("tc_sqmma_op<IM, IN>::run("), text.find("__musa_sqmma_wait();")
        store = text.find("C[(m0 + r) * ldc + n0 + c] = acc[j];")
        if m is None or issue < 0 or "__musa_sqmma_m" not in code:
            problems.append("the SQMMA routine (tc_sqmma_gemm) issues no SQMMA instruction")
        elif wait < 0 or not issue < wait < store:
            problems.append("the SQMMA routine reads its accumulators without waiting for the squad's SQMMAs "
                            "(__musa_sqmma_wait between the issue and the stores)")
    return problems


def _split_args(text: str) -> list:
    """Split a C argument list at top-level commas."""
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out
