"""Runs the consumer warpgroups of a CUDA register program (tilecore_cuda/regprog.py) on the host, as event
traces, and checks two protocols a GPU would only show as hangs or wrong numbers:

- the ping-pong turns (``tc_named_sync`` / ``tc_named_arrive``): every consumer waits for its turn before it
  issues WGMMA and passes it on after; no consumer waits forever; every barrier ends balanced (no arrivals
  left over when the block exits); ids are 2..15 (0 is ``__syncthreads``, 1 the CUDA emitter's barrier over
  a warp-specialized block's consumers), 256 threads each;
- the WGMMA hazards: no statement touches a register array that a WGMMA group still in flight writes or
  reads (``tc_wgmma_wait<N>`` leaves the newest N groups in flight), no WGMMA reads a staged tile the
  consumer does not hold (``tc_mbar_wait`` on its full barrier acquires it, ``tc_mbar_arrive`` on its empty
  barrier releases it: one barrier pair per stage, or per staged tile and stage where the producer's copies
  use one each), nothing is released twice, unheld or while a WGMMA reads it, everything acquired is
  released, and nothing is in flight at exit.

A third check compares two traces of one consumer: every register array must see the same operations in the
same order (a schedule may move a statement only past statements on other arrays), and every WGMMA must read
the same shared tiles of the same stages.

The interpreter knows the emitter's control lines only: ``for (int tc_it = A; ...)`` runs from A to the
trip count it is given (for every trip count: the count is the block's, the same for every consumer),
``if (...)`` over ``tc_c`` / ``tc_it`` / ``tc_s`` / ``tc_rel`` / ``tc_nit`` is decided, and every other line
(unrolled per-thread loops included) is one statement whose register arrays are its accesses.
"""
from __future__ import annotations

import re

_ASSIGN = re.compile(r"^(?:const int |int )?(tc_c|tc_it|tc_s|tc_rel|tc_nit|tc_nu) = (.*);(?:\s*/\*.*\*/)?$")
_IF_LINE = re.compile(r"^if \((.*?)\) (.*)$")
_KNOWN = {"tc_c", "tc_it", "tc_s", "tc_rel", "tc_nit", "tc_nu"}
_FUNCS = {"max", "min"}  # integer max / min of known names (the masked-loop split's loop bounds)
_TILE = re.compile(r"\(tc_base \+ (\d+)u \+ \(unsigned\)(tc_s|\(\([^()]*\) % \d+\)) \* \d+u\)")
_BAR = "(tc_bars + 8u * ("


def _bar_slot(s: str, env: dict) -> int:
    """The mbarrier slot (its 8-byte index after ``tc_bars``) a line's first ``tc_bars + 8u * (...)`` names."""
    k = s.index(_BAR) + len(_BAR)
    depth, j = 1, k
    while depth:
        depth += {"(": 1, ")": -1}.get(s[j], 0)
        j += 1
    return _eval(s[k:j - 1], env)


def layout(src: str) -> tuple:
    """(stages, staged tiles with barriers of their own (1: one barrier pair per stage), staged tile offset ->
    its barrier's tile index), from the producer's per-iteration TMA copies."""
    stages = int(re.search(r"const int tc_s = tc_it % (\d+);", src).group(1))
    tile_of = {}
    for ln in src.splitlines():
        s = ln.strip()
        m = _TILE.search(s)
        if s.startswith("tc_tma_load_") and m and _BAR in s:
            tile_of[int(m.group(1))] = _bar_slot(s, {"tc_s": 0}) // stages
    return stages, max(tile_of.values()) + 1, tile_of


def consumer_lines(src: str) -> list:
    """The consumer warpgroups' branch of a register program (the ``else`` after ``if (tc_wg == 0)``)."""
    lines = src.splitlines()
    start = next(k for k, ln in enumerate(lines) if "const int tc_c = " in ln)
    while lines[start].strip() != "else {":
        start -= 1
    depth, out = 0, []
    for ln in lines[start:]:
        s = ln.strip()
        depth += s.count("{") - s.count("}")
        out.append(s)
        if depth == 0:
            break
    return out[1:-1]


def _tree(lines):
    """Lines -> nested [header, children] blocks (a line ending in an unbalanced ``{`` opens one)."""
    root: list = []
    stack = [root]
    for s in lines:
        if not s or s.startswith("#pragma"):
            continue
        if s == "}":
            stack.pop()
            continue
        if s.endswith("{") and s.count("{") > s.count("}"):
            node = [s[:-1].strip(), []]
            stack[-1].append(node)
            stack.append(node[1])
        else:
            stack[-1].append(s)
    return root


def _decidable(cond: str) -> bool:
    names = set(re.findall(r"[A-Za-z_]\w*", cond)) - _FUNCS
    return bool(names) and names <= _KNOWN


def _eval(expr: str, env: dict) -> int:
    py = expr.replace("(int)", "").replace("&&", " and ").replace("||", " or ").replace("/", "//")
    return int(eval(py, {}, dict(env)))  # noqa: S307 - generated integer expressions over known names


def trace(src: str, consumer: int, trips: int, unmasked: int | None = None) -> list:
    """The events consumer ``consumer`` goes through when the loop runs ``trips`` times, ``unmasked`` of them
    (default: all) without masks where the program splits its loop (``tc_nu``, the block's own count)."""
    events: list = []
    env = {"tc_c": consumer, "tc_rel": -1}
    stages, tiles, tile_of = layout(src)

    def key(slot: int, base: int) -> tuple:  # (barrier's tile, stage) of a full (base 0) or empty slot
        return divmod(slot - base, stages)

    def stmt(s: str):
        m = _IF_LINE.match(s)
        if m and _decidable(m.group(1)):
            if _eval(m.group(1), env):
                body = m.group(2).strip()
                for part in (body[1:-1].split(";") if body.startswith("{") else [body.rstrip(";")]):
                    if part.strip():
                        stmt(part.strip() + ";")
            return
        m = _ASSIGN.match(s)
        if m and m.group(1) != "tc_c":  # tc_c: the consumer being run
            if m.group(1) == "tc_nu":  # a block-level count in 0..trips, the same for every consumer
                env["tc_nu"] = max(0, min(trips, trips if unmasked is None else unmasked))
            else:
                env[m.group(1)] = trips if m.group(1) == "tc_nit" else _eval(m.group(2), env)
            return
        if s.startswith("tc_named_sync(") or s.startswith("tc_named_arrive("):
            args = s[s.index("(") + 1:s.index(");")].rsplit(",", 1)
            events.append(("sync" if "sync" in s else "arrive", _eval(args[0], env), int(args[1])))
        elif "::run(" in s:
            c = s[s.index("::run(") + 6:].split(",")[0].strip()
            regs = {c} | set(re.findall(r"\b(tc_pa_\w+)\[", s))
            tiles_read = [(int(off), _eval(x, env)) for off, x in _TILE.findall(s)]
            reads = {(tile_of[off], stage) for off, stage in tiles_read if off in tile_of}
            events.append(("mma", frozenset(regs), frozenset(reads), frozenset(tiles_read)))
        elif s.startswith("tc_wgmma_commit"):
            events.append(("commit",))
        elif s.startswith("tc_wgmma_wait<"):
            events.append(("wait", int(s[len("tc_wgmma_wait<"):s.index(">")])))
        elif s.startswith("tc_mbar_wait("):
            if _BAR in s:  # a stage's full barrier (the tiles loaded once have their own)
                events.append(("acquire", key(_bar_slot(s, env), 0)))
        elif s.startswith("tc_mbar_arrive("):
            events.append(("release", key(_bar_slot(s, env), tiles * stages)))
        elif s.startswith(("tc_reg_fence", "tc_wgmma_fence", "tc_setmaxnreg")):
            pass
        else:
            names = set(re.findall(r"\b([A-Za-z_]\w*)\[", s))
            if names:
                events.append(("touch", frozenset(names), s))

    def run(nodes):
        for n in nodes:
            if isinstance(n, str):
                stmt(n)
                continue
            head, body = n
            m = re.match(r"for \(int tc_it = (.+?); tc_it < (.*); \+\+tc_it\)$", head)
            if m:
                end = _eval(m.group(2), env) if _decidable(m.group(2)) else trips  # else: the trip count
                for it in range(_eval(m.group(1), env), end):
                    env["tc_it"] = it
                    run(body)
                continue
            m = re.match(r"if \((.*)\)$", head)
            if m and _decidable(m.group(1)):
                if _eval(m.group(1), env):
                    run(body)
                continue
            run(body)  # a scope, a per-thread loop, a bounds check: once, its lines as statements

    run(_tree(consumer_lines(src)))
    return events


def check_turns(traces: list) -> list:
    """Problems of the ping-pong protocol over every consumer's trace (an empty list when there are none)."""
    problems = []
    for c, tr in enumerate(traces):
        for ev in tr:
            if ev[0] in ("sync", "arrive"):
                if not 2 <= ev[1] <= 15:
                    problems.append(f"consumer {c}: named barrier {ev[1]} (0 is __syncthreads, 1 the emitter's "
                                    "barrier over warp-specialized consumers; 2..15 are free)")
                if ev[2] != 256:
                    problems.append(f"consumer {c}: barrier {ev[1]} over {ev[2]} threads, not two warpgroups")
    if problems:
        return problems
    uses_turns = any(ev[0] == "sync" for tr in traces for ev in tr)
    n = len(traces)
    pc, blocked, in_turn = [0] * n, [None] * n, [False] * n
    phase: dict = {}  # barrier id -> [(consumer, waits)] arrived in its current phase (128 threads each)

    def complete(bid):
        if len(phase.get(bid, ())) * 128 >= 256:
            for w, waits in phase.pop(bid):
                if waits:
                    blocked[w], in_turn[w] = None, True
                    pc[w] += 1

    while not all(pc[c] >= len(traces[c]) for c in range(n)):
        moved = False
        for c, tr in enumerate(traces):
            while pc[c] < len(tr) and blocked[c] is None:
                ev = tr[pc[c]]
                moved = True
                if ev[0] in ("sync", "arrive"):
                    phase.setdefault(ev[1], []).append((c, ev[0] == "sync"))
                    if ev[0] == "sync":
                        blocked[c] = ev[1]
                    else:
                        in_turn[c] = False
                        pc[c] += 1
                    complete(ev[1])
                    continue
                if ev[0] == "mma" and uses_turns and not in_turn[c]:
                    problems.append(f"consumer {c} issues WGMMA outside its turn (event {pc[c]})")
                pc[c] += 1
        if not moved:
            stuck = [f"consumer {c} waits on barrier {blocked[c]}" for c in range(n) if blocked[c] is not None]
            return problems + ["deadlock: " + "; ".join(stuck)]
    for bid, who in phase.items():
        problems.append(f"barrier {bid}: {len(who) * 128} threads arrived and never completed at exit")
    return problems


def check_wgmma(events: list) -> list:
    """WGMMA register and stage hazards in one consumer's trace (an empty list when there are none)."""
    problems, groups, building = [], [], None
    held: dict = {}
    for k, ev in enumerate(events):
        if ev[0] == "mma":
            for s in ev[2]:
                if held.get(s, 0) <= 0:
                    problems.append(f"event {k}: WGMMA reads (tile, stage) {s}, which this consumer does not hold")
            building = (building or (frozenset(), frozenset()))
            building = (building[0] | ev[1], building[1] | ev[2])
        elif ev[0] == "commit":
            groups.append(building)
            building = None
        elif ev[0] == "wait":
            groups = groups[len(groups) - ev[1]:] if ev[1] < len(groups) else groups
        elif ev[0] == "touch":
            busy = set().union(*(g[0] for g in groups)) if groups else set()
            if ev[1] & busy:
                problems.append(f"event {k}: {', '.join(sorted(ev[1] & busy))} touched while a WGMMA in flight "
                                f"uses it: {ev[2]}")
        elif ev[0] == "acquire":
            held[ev[1]] = held.get(ev[1], 0) + 1
        elif ev[0] == "release":
            if any(ev[1] in g[1] for g in groups):
                problems.append(f"event {k}: (tile, stage) {ev[1]} released while a WGMMA in flight reads it")
            if held.get(ev[1], 0) <= 0:
                problems.append(f"event {k}: (tile, stage) {ev[1]} released but not held")
            held[ev[1]] = held.get(ev[1], 0) - 1
    if groups or building:
        problems.append("WGMMA still in flight when the consumer ends")
    kept = sorted(k for k, n in held.items() if n > 0)
    if kept:
        problems.append(f"(tile, stage) {', '.join(map(str, kept))} acquired and never released")
    return problems


def per_fragment(events: list) -> dict:
    """Each register array's own history in a trace: the statements that touch it (their text) and the
    WGMMA that write or read it (with the shared tiles, by offset and stage, they read), in order."""
    out: dict = {}
    for ev in events:
        if ev[0] == "touch":
            for name in ev[1]:
                out.setdefault(name, []).append(ev[2])
        elif ev[0] == "mma":
            for name in ev[1]:
                out.setdefault(name, []).append(("wgmma", tuple(sorted(ev[1])), tuple(sorted(ev[3]))))
    return out


def same_per_fragment(base: list, other: list) -> list:
    """Where two traces of one consumer differ in some register array's history (an empty list when every
    array sees the same operations in the same order: a schedule that only moves statements past others
    that touch other arrays keeps the program's meaning)."""
    a, b = per_fragment(base), per_fragment(other)
    problems = []
    for name in sorted(set(a) | set(b)):
        x, y = a.get(name, []), b.get(name, [])
        if x != y:
            k = next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))
            problems.append(f"{name}: operation {k} differs ({x[k] if k < len(x) else 'none'!s:.80} vs "
                            f"{y[k] if k < len(y) else 'none'!s:.80})")
    return problems
