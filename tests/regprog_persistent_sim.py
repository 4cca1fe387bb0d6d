"""Runs a whole block of a persistent CUDA register program (regprog.py, ``tilecore.cuda.attention_persistent``,
docs/decisions.md D45) on the host as a protocol: the producer thread and each consumer warpgroup are actors that
interpret the generated code's control lines, mbarriers (arrival counts, transaction bytes, phases, parity
waits), named barriers and TMA copies, under many interleavings. What a GPU would only show as a hang or as
wrong numbers:

- no deadlock (every actor ends), for every tile order a block of the grid gets;
- every WGMMA reads the data it means: the first gemm of a tile's iteration j reads the K / V stage the producer
  loaded for that tile and iteration (the stage's tag), the second gemm the V stage of the iteration its P came
  from, both the tile's own Q (the buffer of the tiles loaded once);
- the producer never overwrites a stage or a Q buffer a consumer still holds (between its wait on the full
  barrier and its arrival on the empty one), or that a WGMMA in flight still reads, and a consumer never
  releases a stage a WGMMA of its own in flight reads;
- the epilogue writes its rows of the Q buffer only while holding it, and its TMA store's read is waited for
  before the buffer is released.

The interpreter knows the emitter's lines: ``const int X = ...`` / ``X += ...`` over integers, the tile loop, the
``tc_it`` loops, ``if`` over known integers (others run, as the warpgroup's threads that take them do), and
every other line is one statement. Register arrays and their WGMMA hazards are tests/regprog_sim.py's.
"""
from __future__ import annotations

import random
import re

from regprog_sim import _tree as _block_tree

_CAST = re.compile(r"\((?:int|unsigned|long long|unsigned long long)\)")


def _py(expr: str) -> str:
    e = _CAST.sub("", expr)
    e = re.sub(r"\b(\d+)(?:ull|ll|u)\b", r"\1", e)
    e = e.replace("&&", " and ").replace("||", " or ").replace("/", "//")
    e = re.sub(r"!(?!=)", " not ", e)
    return e


_FN = {"tc_floordiv": lambda a, b: a // b, "tc_min": min, "tc_max": max, "min": min, "max": max}


class _Dim:
    def __init__(self, x):
        self.x = x


def _eval(expr: str, env: dict):
    try:
        return eval(_py(expr), dict(_FN), {**env, "gridDim": _Dim(env.get("_grid", 1))})  # noqa: S307 - our own generated integer expressions
    except (NameError, SyntaxError, TypeError, ZeroDivisionError):
        return None


def _args(s: str, name: str) -> list:
    """The top-level comma-separated arguments of the call ``name(...)`` in ``s``."""
    k = s.index(name + "(") + len(name) + 1
    depth, cur, out = 1, "", []
    while True:
        ch = s[k]
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
            if depth == 0:
                out.append(cur.strip())
                return out
        if ch == "," and depth == 1:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
        k += 1


def _if_line(s: str):
    """``(condition, rest)`` of a one-line ``if (...) statement``, its parentheses balanced; else None."""
    if not s.startswith("if ("):
        return None
    depth, k = 0, 3
    while k < len(s):
        depth += {"(": 1, ")": -1}.get(s[k], 0)
        if depth == 0:
            return s[4:k], s[k + 1:]
        k += 1
    return None


def _tree(lines):
    """regprog_sim's block tree of the stripped lines, comment-only lines left out."""
    stripped = (ln.strip() for ln in lines)
    return _block_tree([s for s in stripped if not (s.startswith("/*") and s.endswith("*/"))])


def _branch(src: str, which: str) -> list:
    """The producer's (``if (tc_wg == 0)``) or the consumers' (``else``) lines of the register program."""
    lines = src.split("__global__")[-1].splitlines()

    def past_block(k: int) -> int:  # the index after the block whose opening line is lines[k]
        depth = 0
        while True:
            s = lines[k].strip()
            depth += s.count("{") - s.count("}")
            k += 1
            if depth == 0:
                return k

    start = next(k for k, ln in enumerate(lines) if ln.strip() == "if (tc_wg == 0) {")
    k = past_block(start)
    assert lines[k].strip() == "else {"
    return lines[start + 1:k - 1] if which == "producer" else lines[k + 1:past_block(k) - 1]


class Block:
    """One block: its mbarriers, named barriers, shared-memory regions and actors."""

    def __init__(self, src: str, maps: list, bidx: int, grid: int, nc: int, seed: int):
        self.src, self.bidx, self.grid, self.nc = src, bidx, grid, nc
        self.box_bytes = []
        for m in maps:
            n = int(m["elem_bytes"])
            for b in m["box"]:
                n *= int(b)
            self.box_bytes.append(n)
        self.bars: dict = {}      # offset -> [count, pending, tx, completed]
        self.named: dict = {}     # id -> list of (actor, waits)
        self.regions: dict = {}   # start -> [end, tag, holders, full barrier]
        self.problems: list = []
        self.turns = "tc_named_sync(2" in src
        self.maps_seen: dict = {}
        self.maps = self.maps_seen  # the tensor map the first gemm's stages come from ("s"), the second's ("pv")
        self.rng = random.Random(seed)
        self.init_lines = [ln for ln in self.src.split("__global__")[-1].splitlines() if "tc_mbar_init(" in ln]
        self.stages = int(re.search(r"for \(int s = 0; s < (\d+); \+\+s\)", self.src).group(1))

    # -- mbarriers -------------------------------------------------------------------------------------------
    def init(self):
        """The mbarriers, and their roles from the order the program initializes them: each full barrier (count 1)
        followed by its empty one; the stage ring's first, then the Q buffers' (a persistent grid's)."""
        order = []
        ring = [_args(ln.strip(), "tc_mbar_init") for ln in self.init_lines if "(s)" in ln]
        once = [_args(ln.strip(), "tc_mbar_init") for ln in self.init_lines if "(s)" not in ln]
        for s_, a in [(s_, a) for s_ in range(self.stages) for a in ring] + [(None, a) for a in once]:
            off, count = _eval(a[0], {"s": s_, "tc_bars": 0}), _eval(a[1], {"s": s_, "tc_bars": 0})
            self.bars[off] = [count, count, 0, 0]
            order.append((off, count, s_ is not None))
        self.empty_to_full, self.q_full, self.q_empty = {}, set(), set()
        for (f, cf, sf), (e, ce, se) in zip(order[::2], order[1::2]):
            assert cf == 1 and ce == 128 * self.nc, "full / empty barriers in pairs"
            self.empty_to_full[e] = f
            if not sf:
                self.q_full.add(f)
                self.q_empty.add(e)

    def arrive(self, off, n, tx=0):
        b = self.bars.get(off)
        if b is None:
            self.problems.append(f"arrival on a barrier never initialized (offset {off})")
            return
        b[1] -= n
        b[2] += tx
        self._complete(off)

    def deliver(self, off, nbytes):
        b = self.bars[off]
        b[2] -= nbytes
        self._complete(off)

    def _complete(self, off):
        b = self.bars[off]
        if b[1] < 0:
            self.problems.append(f"barrier {off}: more arrivals than its count in one phase")
        if b[1] <= 0 and b[2] == 0:
            b[3] += 1
            b[1] = b[0]

    def passed(self, off, parity) -> bool:
        return self.bars[off][3] % 2 != parity


def _actor(block: Block, lines: list, who: str, env0: dict):
    """A generator interpreting ``lines`` for one actor: yields a predicate (callable) when it blocks."""
    env = dict(env0)
    st = {"groups": [], "building": set(), "s_gemms": [], "pv_gemms": 0, "held_q": None, "tile": None,
          "bulk_pending": False, "in_turn": False}

    last_if = [True]

    def region_at(addr):
        for start, r in block.regions.items():
            if start <= addr < r[0]:
                return start, r
        return None, None

    def stmt(s):
        if s.startswith("else "):  # the other branch of the one-line if before it
            if not last_if[0]:
                yield from stmt(s[5:].strip())
            return
        m = _if_line(s)
        if m and not s.endswith("{"):
            v = _eval(m[0], env)
            last_if[0] = v is None or bool(v)
            if v is None or v:
                body = m[1].strip()
                for part in (body[1:-1].split(";") if body.startswith("{") else [body.rstrip(";")]):
                    if part.strip():
                        yield from stmt(part.strip() + ";")
            return
        m = re.match(r"^(?:const )?(?:int|unsigned|long long) (.*);", s)
        if m and "[" not in s.split("=")[0]:
            for part in _args("f(" + m.group(1) + ")", "f"):
                name, _, val = part.partition("=")
                name = name.strip()
                if name == "tc_c":
                    continue
                v = _eval(val, env)
                if v is not None:
                    env[name] = v
                else:
                    env.pop(name, None)
            return
        m = re.match(r"^(tc_gb) \+= (.*);", s)
        if m:
            env["tc_gb"] += _eval(m.group(2), env)
            return
        if s.startswith("tc_mbar_wait("):
            a = _args(s, "tc_mbar_wait")
            off, par = _eval(a[0], env), _eval(a[1], env)
            if off is None or par is None:
                block.problems.append(f"{who}: cannot evaluate {s}")
                return
            yield lambda: block.passed(off, par)
            if who != "producer":
                if off in block.q_full:
                    st["held_q"] = off
                    for start, r in block.regions.items():
                        if r[3] == off:
                            r[2].add(who)
                else:
                    for start, r in block.regions.items():
                        if r[3] == off:
                            r[2].add(who)
            return
        if s.startswith("tc_mbar_expect_tx("):
            a = _args(s, "tc_mbar_expect_tx")
            block.arrive(_eval(a[0], env), 1, _eval(a[1], env))
            return
        if s.startswith("tc_mbar_arrive("):
            off = _eval(_args(s, "tc_mbar_arrive")[0], env)
            if who != "producer":
                empty_to_full = block.empty_to_full.get(off)
                for start, r in block.regions.items():
                    if r[3] == empty_to_full:
                        if who not in r[2]:
                            block.problems.append(f"{who}: releases region {start} it does not hold ({s})")
                        in_flight = any(start in g for g in st["groups"]) or start in st["building"]
                        if in_flight:
                            block.problems.append(f"{who}: releases region {start} while its WGMMA reads it")
                        if off in block.q_empty and st["bulk_pending"]:
                            block.problems.append(f"{who}: releases the Q buffer before its TMA store read it")
                        r[2].discard(who)
            block.arrive(off, 128 if who != "producer" else 1)
            return
        if s.startswith("tc_tma_load_"):
            name = s[:s.index("(")]
            a = _args(s, name)
            dst, mi, bar = _eval(a[0], env), int(a[1].replace("&tc_tmap", "")), _eval(a[2], env)
            nbytes = block.box_bytes[mi]
            tag = (env.get("tc_tile"), env.get("k"), mi) if bar not in block.q_full else (env.get("tc_tile"),)
            rb = block.region_base(dst)
            r = block.regions.get(rb)
            if r is not None and r[2]:
                block.problems.append(f"producer: overwrites region {rb} that {sorted(r[2])} still hold ({tag})")
            block.regions[rb] = [block.region_end(rb), tag, set(), bar]
            block.deliver(bar, nbytes)
            return
        if "::run(" in s:
            struct = s[:s.index("::run(")]
            if block.turns and not st["in_turn"]:
                block.problems.append(f"{who}: issues a WGMMA outside its turn")
            addrs = [_eval(x, env) for x in re.findall(r"tc_wgmma_desc\((.*?), \d+, \d+\)", s)]
            reads = []
            for ad in addrs:
                if ad is None:
                    block.problems.append(f"{who}: cannot evaluate a WGMMA address in {s[:80]}")
                    continue
                rb = block.region_base(ad)
                r = block.regions.get(rb)
                if r is None or who not in r[2]:
                    block.problems.append(f"{who}: WGMMA reads region {rb} it does not hold")
                    continue
                reads.append((rb, r[1]))
                st["building"].add(rb)
            if "_rs_" in struct:  # P @ V: iteration pv_gemms's V
                kk = st["s_gemms"][st["pv_gemms"]] if st["pv_gemms"] < len(st["s_gemms"]) else None
                if not env.get("_pv_started"):
                    env["_pv_started"] = True
                    for rb, tag in reads:
                        block.maps.setdefault("pv", tag[-1])
                        if tag != (st["tile"], kk, block.maps["pv"]) or block.maps["pv"] == block.maps.get("s"):
                            block.problems.append(f"{who}: P @ V of iteration {kk} of tile {st['tile']} reads {tag}")
            else:  # S = Q K^T: this iteration's K and the tile's Q
                if not env.get("_s_started"):
                    env["_s_started"] = True
                    st["s_gemms"].append(env.get("k"))
                    for rb, tag in reads:
                        if len(tag) == 3:
                            block.maps.setdefault("s", tag[-1])
                        want = {(st["tile"],), (st["tile"], env.get("k"), block.maps.get("s"))}
                        if tag not in want:
                            block.problems.append(f"{who}: S of iteration {env.get('k')} of tile {st['tile']} "
                                                  f"reads {tag}")
            return
        if s.startswith("tc_wgmma_commit"):
            if env.pop("_pv_started", None):
                st["pv_gemms"] += 1
            env.pop("_s_started", None)
            st["groups"].append(set(st["building"]))
            st["building"] = set()
            return
        if s.startswith("tc_wgmma_wait<"):
            n = int(s[len("tc_wgmma_wait<"):s.index(">")])
            st["groups"] = st["groups"][len(st["groups"]) - n:] if n < len(st["groups"]) else st["groups"]
            if n == 0:
                st["groups"] = []
            return
        if s.startswith("tc_named_sync(") or s.startswith("tc_named_arrive("):
            name = "tc_named_sync" if "sync" in s else "tc_named_arrive"
            a = _args(s, name)
            bid, cnt = _eval(a[0], env), _eval(a[1], env)
            waits = name == "tc_named_sync"
            ph = block.named.setdefault(bid, {"who": [], "gen": 0})
            mygen = ph["gen"]
            if who in ph["who"]:
                block.problems.append(f"{who}: arrives twice on named barrier {bid} in one phase")
            ph["who"].append(who)
            if len(ph["who"]) * 128 >= cnt:
                ph["who"], ph["gen"] = [], ph["gen"] + 1
            if cnt == 256:  # a ping-pong turn: taken by the sync, passed on by the arrival
                block.turns = True
                st["in_turn"] = waits
            if waits:
                yield lambda: ph["gen"] > mygen
            return
        if s.startswith("tc_rp_stmatrix_x4("):
            r = block.regions.get(block.region_base(env.get("tc_o", -1)))
            if r is None or who not in r[2] or st["groups"]:
                block.problems.append(f"{who}: the epilogue writes a Q buffer it does not hold, or under a WGMMA")
            return
        if s.startswith("tc_tma_store_"):
            st["bulk_pending"] = True
            return
        if s.startswith("tc_bulk_wait_read"):
            st["bulk_pending"] = False
            return

    def run(nodes):
        for n in nodes:
            if isinstance(n, str):
                yield from stmt(n)
                yield None  # one line: a scheduling point
                continue
            head, body = n
            m = re.match(r"for \(int tc_tile = blockIdx\.x, tc_tn = 0; tc_tile < (.*); tc_tile \+= gridDim\.x, "
                         r"\+\+tc_tn\)$", head)
            if m:
                total = _eval(m.group(1), env)
                tn = 0
                for t in range(block.bidx, total, block.grid):
                    env["tc_tile"], env["tc_tn"] = t, tn
                    st["tile"], st["s_gemms"], st["pv_gemms"] = t, [], 0
                    yield from run(body)
                    tn += 1
                continue
            m = re.match(r"for \(int tc_it = (.+?); tc_it < (.*); \+\+tc_it\)$", head)
            if m:
                a, b = _eval(m.group(1), env), _eval(m.group(2), env)
                for it in range(a, b):
                    env["tc_it"] = it
                    yield from run(body)
                env.pop("tc_it", None)
                continue
            m = re.match(r"if \((.*)\)$", head)
            if m:
                v = _eval(m.group(1), env)
                if v is None or v:
                    yield from run(body)
                continue
            yield from run(body)  # a scope or per-thread loop: once

    return run(_tree(lines))


def simulate(kernel, blocks: int = 3, seeds: int = 6) -> list:
    """Problems (an empty list when there are none) of ``kernel`` (a compiled persistent register program) run
    as ``blocks`` blocks of its tiles, each under ``seeds`` random interleavings of its actors."""
    src = kernel.get_kernel_source()
    maps = kernel.source.meta["tensor_maps"]
    threads = int(re.search(r"__launch_bounds__\((\d+)", src).group(1))
    nc = threads // 128 - 1
    prod, cons = _branch(src, "producer"), _branch(src, "consumer")
    problems = []
    for b in range(blocks):
        for seed in range(seeds):
            blk = Block(src, maps, b, blocks, nc, seed)
            blk.init()
            _layout(blk, src)
            env = {"tc_bars": 0, "tc_base": 0, "_grid": blocks}
            actors = {"producer": _actor(blk, prod, "producer", env),
                      **{f"consumer {c}": _actor(blk, cons, f"consumer {c}", {**env, "tc_c": c}) for c in range(nc)}}
            waiting: dict = {name: None for name in actors}
            done: set = set()
            steps = 0
            while len(done) < len(actors) and steps < 5_000_000:
                ready = [a for a in actors if a not in done and (waiting[a] is None or waiting[a]())]
                if not ready:
                    problems.append(f"block {b}, seed {seed}: deadlock ({', '.join(sorted(set(actors) - done))} "
                                    "waiting)")
                    break
                a = blk.rng.choice(ready)
                waiting[a] = None
                for _ in range(blk.rng.randint(1, 40)):
                    try:
                        pred = next(actors[a])
                    except StopIteration:
                        done.add(a)
                        break
                    steps += 1
                    if pred is not None and not pred():
                        waiting[a] = pred
                        break
            for bid, ph in blk.named.items():
                if ph["who"] and len(done) == len(actors):
                    blk.problems.append(f"named barrier {bid}: {', '.join(ph['who'])} arrived and nobody completed it "
                                        "by the block's end")
            problems += [f"block {b}, seed {seed}: {p}" for p in dict.fromkeys(blk.problems)]
            if problems:
                return problems
    return problems


def _layout(blk: Block, src: str) -> None:
    """The block's shared-memory regions (each TMA copy's destination box) and barrier roles, from the producer's
    lines: a stage's full barrier and its empty one, the Q buffers' full / empty barriers."""
    prod = "\n".join(_branch(src, "producer"))
    loads = re.findall(r"tc_tma_load_\dd\((.*?), &tc_tmap(\d+), (\(tc_bars.*?\)\)?), ", prod)
    # regions: each load's destination at every stage / Q buffer, box bytes long
    starts = set()
    for dst, mi, _ in loads:
        for env in ({"tc_s": s, "tc_qb": q, "tc_base": 0} for s in range(4) for q in range(2)):
            v = _eval(dst, env)
            if v is not None:
                starts.add((v, blk.box_bytes[int(mi)]))
    blk.bounds = sorted(starts)

    def base(addr):
        hit = [s for s, n in blk.bounds if s <= addr < s + n]
        return hit[0] if hit else None

    def end(start):
        return next(s + n for s, n in blk.bounds if s == start)

    blk.region_base, blk.region_end = base, end
