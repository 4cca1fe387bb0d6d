"""Instructions a thread executes per iteration of a kernel's main loop, from its SASS (``cuobjdump -sass``),
for each path through the loop's forward branches (docs/decisions.md D35 counts with it).

The main loop is the shortest backward branch whose body holds at least ``min_mma`` HGMMA (the consumers' loop
of a register program: the producer's has none). Inside it, every conditional forward branch to an address in
the loop is a choice; unconditional branches are followed; branches leaving the loop (the mbarrier try-wait
retries) are not. ``paths`` gives one count per combination of choices, so a branch that skips work shows as
two totals.

    python tests/sass_paths.py FILE.sass ...     # a table per file
"""
from __future__ import annotations

import collections
import itertools
import re
import sys

_LINE = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_TARGET = re.compile(r"BRA (?:!?U?P\w+, )?(0x[0-9a-f]+)")
#: the classes D35 reports (the rest is "other": uniform-datapath address arithmetic, barriers, moves)
CLASSES = ("HGMMA", "MUFU", "FFMA", "FMUL", "FADD", "FMNMX", "FSETP", "SHFL", "F2FP", "HADD2", "VOTE", "BRA")


def parse(sass: str) -> list:
    """``[(address, instruction text)]`` in address order."""
    return [(int(m.group(1), 16), m.group(2).strip()) for m in map(_LINE.match, sass.splitlines()) if m]


def opcode(text: str) -> str:
    """The opcode without predicate and modifiers: ``@!P0 FMUL.FTZ R1, ...`` -> ``FMUL``."""
    return re.sub(r"^@!?U?P\w+\s+", "", text).split()[0].split(".")[0]


def main_loop(ins: list, min_mma: int = 16, unit: str = "HGMMA") -> list:
    """Indices into ``ins`` of the shortest backward-branch loop holding at least ``min_mma`` HGMMA (``unit``:
    another opcode, e.g. HMMA for the mma.sync kernels)."""
    best = None
    for i, (a, t) in enumerate(ins):
        m = _TARGET.search(t)
        if not m or opcode(t) != "BRA" or int(m.group(1), 16) >= a:
            continue
        tgt = int(m.group(1), 16)
        idx = [k for k, (b, _) in enumerate(ins) if tgt <= b <= a]
        if sum(opcode(ins[k][1]) == unit for k in idx) >= min_mma and (best is None or len(idx) < len(best)):
            best = idx
    if best is None:
        raise ValueError(f"no loop with {min_mma} or more {unit} in this SASS")
    return best


def paths(ins: list, idx: list) -> list:
    """``[(choices, Counter of opcodes)]``, one per combination of the loop's conditional forward branches
    (``choices[n]`` True: the n-th such branch taken)."""
    lo, hi = ins[idx[0]][0], ins[idx[-1]][0]
    pos = {a: k for k, (a, _) in enumerate(ins)}
    conds = [k for k in idx[:-1] if opcode(ins[k][1]) == "BRA" and ins[k][1].startswith("@")
             and _TARGET.search(ins[k][1]) and lo < int(_TARGET.search(ins[k][1]).group(1), 16) <= hi]
    if len(conds) > 8:
        raise ValueError(f"{len(conds)} forward branches in the loop: too many paths to count")
    out = []
    for choice in itertools.product((False, True), repeat=len(conds)):
        take = dict(zip(conds, choice))
        k, steps, c = idx[0], 0, collections.Counter()
        while steps < 100000:
            steps += 1
            a, t = ins[k]
            c[opcode(t)] += 1
            if opcode(t) == "FSETP" and ".GEU" in t and "-126" in t:
                c["exp2f range tests"] += 1  # exp2f without flushing: is the input below -126?
            if opcode(t) == "FMUL" and t.startswith("@"):
                c["predicated FMUL"] += 1  # ... then halve it and square the result
            if k == idx[-1]:
                break
            m = _TARGET.search(t) if opcode(t) == "BRA" else None
            if m:
                tgt = int(m.group(1), 16)
                if (take.get(k) if k in take else not t.startswith("@")) and lo <= tgt <= hi:
                    k = pos[tgt]
                    continue
            k += 1
        out.append((choice, c))
    return out


def loop_counts(sass: str, min_mma: int = 16) -> list:
    """Per path through the main loop: ``{class: count, ..., "other": n, "total": n}``, fewest first."""
    ins = parse(sass)
    rows = []
    for _, c in paths(ins, main_loop(ins, min_mma)):
        row = {k: c.get(k, 0) for k in CLASSES}
        total = sum(v for k, v in c.items() if k[0].isupper())
        row["other"] = total - sum(row.values())
        row["total"] = total
        row["exp2f range tests"], row["predicated FMUL"] = c["exp2f range tests"], c["predicated FMUL"]
        rows.append(row)
    return sorted(rows, key=lambda r: r["total"])


_REG = re.compile(r"\bR(\d+)\b")


_CONTROL = re.compile(r"\s*/\*([0-9a-f]{4,})\*/[^\n]*?/\* (0x[0-9a-f]{16}) \*/\s*\n\s*/\* (0x[0-9a-f]{16}) \*/")


def stalls(sass: str, min_mma: int = 16, unit: str = "HGMMA") -> dict:
    """The main loop's scheduling as ptxas planned it, from each instruction's control bits (the high word's bits
    41-44: the cycles the warp waits before issuing its next instruction; bits 52-57: the scoreboards it waits
    on, set by variable-latency producers such as MUFU, SHFL and the WGMMA waits): ``{"cycles": the sum of the
    stall counts along the straight line, "scoreboard waits": instructions that wait on a scoreboard}``. A lower
    bound on a warp's cycles an iteration, without the variable latencies."""
    ctrl = {int(m.group(1), 16): int(m.group(3), 16) for m in _CONTROL.finditer(sass)}
    ins = parse(sass)
    cycles = waits = 0
    for k in main_loop(ins, min_mma, unit):
        hi = ctrl.get(ins[k][0])
        if hi is None:
            continue
        cycles += (hi >> 41) & 0xF
        waits += ((hi >> 52) & 0x3F) != 0
    return {"cycles": cycles, "scoreboard waits": waits}


def chain_depth(sass: str, op: str = "FMNMX", min_mma: int = 16) -> int:
    """The longest chain of ``op`` instructions in the main loop (straight through, in address order) in which
    each reads a register the previous one wrote: the row reductions' dependency depth (D39: 44 for a
    176-wide row reduced as a chain, 6 as a tree)."""
    ins = parse(sass)
    depth: dict = {}  # register -> depth of the op chain that last wrote it (0: written by something else)
    best = 0
    for k in main_loop(ins, min_mma):
        t = ins[k][1]
        regs = [int(r) for r in _REG.findall(re.sub(r"^@!?U?P\w+\s+", "", t))]
        if not regs:
            continue
        dst, srcs = regs[0], regs[1:]
        if opcode(t) == op:
            d = 1 + max((depth.get(r, 0) for r in srcs), default=0)
            best = max(best, d)
            depth[dst] = d
        else:
            depth[dst] = 0
    return best


def exp2_overlapped(sass: str, min_mma: int = 16) -> int:
    """MUFU instructions the main loop issues after its wait for the oldest WGMMA group (``WARPGROUP.DEPBAR.LE
    gsb0, 0x1``: S is ready) and before the wait for every group (``gsb0, 0x0``: P @ V done), around the loop's
    back edge: the exp2s the intra-warpgroup overlap runs while the P @ V WGMMA does (D39: none with ptxas 13.0,
    which hoists the second wait above them all)."""
    ins = parse(sass)
    idx = main_loop(ins, min_mma)
    text = [ins[k][1] for k in idx]
    first = [n for n, t in enumerate(text) if "DEPBAR.LE gsb0, 0x1" in t]
    if not first:
        raise ValueError("no WARPGROUP.DEPBAR.LE gsb0, 0x1 in the main loop")
    n, count = first[-1], 0
    for step in range(1, len(text) + 1):
        t = text[(n + step) % len(text)]
        if "DEPBAR.LE gsb0, 0x0" in t:
            return count
        count += opcode(t) == "MUFU"
    raise ValueError("no WARPGROUP.DEPBAR.LE gsb0, 0x0 in the main loop")


if __name__ == "__main__":
    for f in sys.argv[1:]:
        print(f)
        for row in loop_counts(open(f).read()):
            print("  " + " ".join(f"{k} {v}" for k, v in row.items()))
        text = open(f).read()
        print(f"  {stalls(text)}")
        print(f"  FMNMX depth {chain_depth(text)}, MUFU overlapped with P @ V {exp2_overlapped(text)}")
