"""Heaviest blocks first: ``tilecore.heaviest_first`` (pass config), docs/decisions.md D54.

A device's block scheduler starts a grid's blocks in the order of their linear index (x fastest, then y, then z)
as multiprocessors free up. Where a block's work grows with one of its indices (causal attention: query block
``bx`` runs ``ceil((bx + 1) bm / bn)`` key iterations), that order starts the longest blocks last, and the grid
ends on a tail of them. ``tilecore.order_blocks`` (``layout`` slot, after ``tilecore.collect_hints``) finds such
a launch from its IR and records an order for the emitter (``func.attrs["block_order"]``); the SIMT C++ emitter
(``SIMTCppEmitter.block_indices``) then maps the block's linear index ``L`` to the block variables:

    the growing axis a (extent ga), the other axes flattened in grid order ("rows": R of them),
    sections of G rows (the last one may be smaller: Gs rows), S = G ga blocks a section:
        s = L / S, w = L % S, Gs = min(G, R - s G)
        a = ga - 1 - w / Gs          (descending: the heaviest first)
        row = s G + w % Gs           (then split into the other axes, first fastest)

so each section of ``G`` rows runs longest-processing-time first (FA3's scheduler for causal attention: heads
in sections, query blocks longest first). ``G = 1`` is the plain reversal of the growing axis inside each row.
Every block still computes exactly the tile its block variables name (a permutation of the blocks): the same
results, bit for bit.

The analysis: the launch's loops whose trip count (the top-level binds of the block substituted) names a block
variable; all of them must name the same one and no other, the grid and the trip counts must be static, and the
block's work (the sum of those trip counts) must be non-decreasing along that axis and not constant. A decreasing
one is already heaviest first. Anything else is left in grid order with a note.

Values: ``True`` (the default since the H100 measured it, ``HEAVIEST_FIRST_DEFAULT``): sections of the smallest power of
two of rows with at least ``limits.sm_count`` blocks (one row where the profile lacks it); an int ``n >= 1``:
sections of ``n`` rows; ``False``: grid order.
"""
from __future__ import annotations

from ..ir import Bind, For, KernelLaunch, Seq, as_expr, const_value, simplify, walk, walk_expr
from . import tile_pass

OPTION = "tilecore.heaviest_first"
#: the default of ``tilecore.heaviest_first`` (D54: on; measured on the H100: b1 h32 s4096 exact causal +10.5%, b1 h16 s8192
#: +7.7%, b8 h32 within noise)
HEAVIEST_FIRST_DEFAULT = True
#: at most this many values of the growing index are evaluated (a longer axis keeps the grid order, with a note)
MAX_EVALUATED = 4096


def _mentions(e, v) -> bool:
    found = []
    walk_expr(e, lambda x: found.append(1) if x is v else None)
    return bool(found)


def _substitute(e, table: dict):
    from .pipeline import substitute

    return substitute(e, table)


def _launches(body) -> list:
    out = []
    walk(body, lambda s: out.append(s) if isinstance(s, KernelLaunch) else None)
    return out


def analyze(launch: KernelLaunch, every: bool = True):
    """``(axis, weights, None)`` where the block's work grows along block axis ``axis`` (``weights[i]``: the sum of
    the varying trip counts at index ``i``; with ``every`` False only the first and the last index), else
    ``(None, None, why)``."""
    grid = [const_value(simplify(as_expr(g))) for g in launch.grid]
    if len(grid) > 3:
        return None, None, "the grid has more than three dimensions"
    binds: dict = {}
    top = launch.body.body if isinstance(launch.body, Seq) else [launch.body]
    for x in top:  # the block's top-level binds (their values may name block variables)
        if isinstance(x, Bind):
            binds[id(x.var)] = _substitute(x.value, binds)
    loops: list = []
    walk(launch.body, lambda s: loops.append(s) if isinstance(s, For) else None)
    varying, axis = [], None
    for lp in loops:
        ext = simplify(_substitute(as_expr(lp.extent), binds))
        named = [i for i, v in enumerate(launch.block_vars) if _mentions(ext, v)]
        if not named:
            continue
        if len(named) > 1 or (axis is not None and named[0] != axis):
            return None, None, "the loops' trip counts vary with more than one block index"
        axis = named[0]
        varying.append(ext)
    if axis is None:
        return None, None, "no loop's trip count varies with a block index"
    n = grid[axis]
    if not isinstance(n, int) or any(not isinstance(g, int) for g in grid):
        return None, None, "the grid is not static"
    if n > MAX_EVALUATED:
        return None, None, f"the growing axis has {n} blocks (at most {MAX_EVALUATED} are evaluated)"
    v = launch.block_vars[axis]
    weights = []
    for i in (range(n) if every else sorted({0, n - 1})):
        total = 0
        for ext in varying:
            c = const_value(simplify(_substitute(ext, {id(v): as_expr(i)})))
            if not isinstance(c, int):
                return None, None, "a trip count that varies with the block is not static given the block"
            total += max(c, 0)
        weights.append(total)
    return axis, weights, None


def _option(ctx):
    """The option's value, checked: False (grid order), True (automatic sections) or an int >= 1."""
    opt = ctx.option(OPTION, HEAVIEST_FIRST_DEFAULT)
    if opt is None or opt is False or (type(opt) is int and opt == 0):
        return False
    if opt is True or (type(opt) is int and opt >= 1):
        return opt
    from ..errors import CompileError

    raise CompileError(f"{OPTION}={opt!r}: True, False or a number of rows a section (an int >= 1)")


def sections(ctx, opt, axis_blocks: int, rows: int) -> int:
    """The section size ``G`` (rows of the other axes) for option value ``opt`` (True or an int >= 1)."""
    if opt is True:
        lim = ctx.capabilities.limit("sm_count")
        units = int(lim[0]) if lim is not None else 0
        g = 1
        while g * axis_blocks < units and g < rows:
            g *= 2
        return max(1, min(g, rows))
    return min(int(opt), rows)


@tile_pass("tilecore.order_blocks")
def order_blocks(func, ctx):
    """Where a block's work grows with one block index, start the heaviest blocks first (``tilecore.heaviest_first``):
    records ``func.attrs["block_order"] = (axis, grid, G)`` for the emitter; ``func.attrs["heaviest_first"]``
    (``kernel.meta["attrs"]``) says what was done and why, for every kernel with a loop whose trip count varies
    with a block index."""
    opt = _option(ctx)
    launches = _launches(func.body)
    if len(launches) != 1:
        return func
    launch = launches[0]
    axis, weights, why = analyze(launch, every=opt is not False)  # (off: the ends only, for the note)
    name = func.name

    def noted(text: str, **more):
        return func.with_body(func.body, heaviest_first=f"{name}: {text}", **more)

    if axis is None:
        if why and why != "no loop's trip count varies with a block index":
            return noted(f"blocks in grid order ({why})")
        return func
    letter = "xyz"[axis]
    span = f"{weights[0]} .. {weights[-1]} iterations"
    if opt is False:
        if weights[-1] > weights[0]:
            return noted(f"blocks in grid order: the work grows along {letter} ({span}), so the longest blocks start "
                         f"last ({OPTION}=True starts them first)")
        return func
    if len(set(weights)) == 1:
        return noted(f"blocks in grid order (the work does not vary along {letter}: {weights[0]} iterations)")
    if all(a >= b for a, b in zip(weights, weights[1:])):
        return noted(f"blocks in grid order (the work falls along {letter}, {span}: the heaviest start first)")
    if not all(a <= b for a, b in zip(weights, weights[1:])):
        more = "..." if len(weights) > 8 else ""
        return noted(f"blocks in grid order (the work along {letter} is not monotone: {weights[:8]}{more})")
    if _swizzle(func):
        return noted(f"blocks in T.use_swizzle's order (the work grows along {letter}; {OPTION} does not reorder a "
                     "swizzled grid)")
    grid = [int(const_value(simplify(as_expr(g)))) for g in launch.grid]
    rows = 1
    for i, n in enumerate(grid):
        if i != axis:
            rows *= n
    g = sections(ctx, opt, grid[axis], rows)
    why = "; the profile has no limits.sm_count" if opt is True and ctx.capabilities.limit("sm_count") is None else ""
    return noted(f"heaviest blocks first: {letter} descending ({span} in grid order) in sections of {g} of the other "
                 f"axes' {rows} rows ({OPTION}{why}; in the order the SIMT C++ emitters give the block index)",
                 block_order=(axis, tuple(grid), g))


def _swizzle(func) -> bool:
    from ..codegen.simtcpp import _swizzle_hint

    return bool(_swizzle_hint(func))


