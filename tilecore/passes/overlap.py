"""The softmax beside the second gemm: a pipelined loop's body rotated so that iteration k's first gemm and
iteration k - 1's last gemm run on the matrix unit together, and the statements between them that the last gemm
does not touch run while it does (tilecore.pipeline_overlap, docs/decisions.md D59; FA3's intra-warpgroup
overlap, the register programs' order of D28 / D39).

The planner (pipeline.py, the early-issue form: the body's first gemm waits for every earlier one) hands over
the body in three parts: ``pre`` (up to and including the first gemm: FlashAttention's mask and S = Q K^T),
``post`` (the rest: the softmax, the wait for the late copy group's stage, the last gemm O += P V, deferred:
one group left pending) and the late group's wait. This module checks that the rotation keeps the program's
meaning and builds its pieces:

- ``early``: the statements of ``post`` before the first one that touches the last gemm's registers (its
  accumulators or the registers it reads as an operand: ``MatrixSync.reads``); they run while the previous
  iteration's last gemm does (the maximum, the exponentials, the row sums);
- ``late``: the rest before the late wait (O's rescale, P's conversion), after the wait for every gemm;
- the last gemm, issued one iteration late (for k - 1, right after iteration k's first gemm), its wait
  dropped (a commit only), and a copy of it after the loop that waits for itself.

Each statement keeps its operands and its order relative to every statement it shares a buffer with, so the
results are bit for bit those of the unrotated loop.
"""
from __future__ import annotations

from ..ir import (BufferLoad, CopyBarrierWait, If, MatrixSync, PerThread, Select, Seq, Store, Turn, collect, const_value,
                  rewrite)
from ..ir.visit import buffers_named

OPTION = "tilecore.pipeline_overlap"  #: default on where it applies (D59)
#: D59: the mask of a split masked iteration applied after the first gemm, its accumulators cleared before it
MASK_AFTER = "tilecore.pipeline_mask_after_gemm"
#: D70: the loop body duplicated under the split mask's condition (each path one straight run from the gemms' issue
#: to the end of the iteration), not the mask alone under it
MASK_UNSWITCH = "tilecore.pipeline_mask_unswitch"
#: D70: "auto" (on wherever it applies) since round 2: causal rows +1 to +5% on the H200 (d256 causal 0.958 -> 1.004).
#: D74: "auto" takes "loops" (the masked iterations in a loop of their own) under fast math and where the last gemm's
#: accumulator holds 128 elements a thread or more (d256; pipeline's two_loops); True is D70's one loop everywhere
MASK_UNSWITCH_DEFAULT = "auto"
#: D87: the late statements that scale only the last gemm's accumulators (FlashAttention's O *= alpha) moved from the
#: end of iteration k - 1 to iteration k's turn, between the first gemm's issue and the rotated last gemm (off)
SCALE_IN_TURN = "tilecore.pipeline_scale_in_turn"
#: D87: "auto" (the default since round 3) takes it in the exact build where the first gemm's accumulator holds
#: LOOPS_MIN_FIRST (88) elements a thread or more beside a last one of 64 or more (d128 at 128x176: +3.5% non-causal,
#: +1% causal on the H200, three processes); not at 128x128 (-1 to -3%) nor under fast math (-3% at 128x128)
SCALE_IN_TURN_DEFAULT = "auto"


def _gemm_sync(item, phase):
    syncs = [x for x in collect(item, MatrixSync) if x.phase == phase]
    return syncs


def parts(pre: list, post: list, late_wait) -> dict | None:
    """The rotation's pieces, or None where the body is not of the form (two gemms, the last deferred, a late
    copy group waited for right before it) or a statement would see another's result in a different order."""
    if late_wait is None or not pre or not post or not isinstance(late_wait, CopyBarrierWait):
        return None
    late_bar = late_wait.barrier
    first_ends = _gemm_sync(pre[-1], "end")
    if not first_ends or first_ends[-1].pending != 0 or len(_gemm_sync(pre[-1], "begin")) != 1:
        return None
    last = post[-1]
    begins, ends = _gemm_sync(last, "begin"), _gemm_sync(last, "end")
    if len(begins) != 1 or len(ends) != 1 or ends[0].pending != 1:
        return None
    at = [i for i, x in enumerate(post) if isinstance(x, CopyBarrierWait) and x.barrier is late_bar]
    if at != [len(post) - 2]:
        return None  # the late group's wait right before the last gemm, nothing between
    between = post[:-2]
    if any(collect(x, MatrixSync) for x in between) or any(collect(x, CopyBarrierWait) for x in between):
        return None
    gemm_regs = {id(ends[0].acc)} | {id(b) for b in begins[0].reads}
    if not begins[0].reads:
        return None  # the last gemm's operands in shared memory: nothing the threads write between
    first = next((i for i, x in enumerate(between) if buffers_named(x) & gemm_regs), len(between))
    early, late = between[:first], between[first:]
    # the first gemm and what comes before it move ahead of the previous iteration's last gemm: they must not
    # touch its registers; the early statements run beside it: neither
    if any(buffers_named(x) & gemm_regs for x in pre + early):
        return None
    # the last gemm reads what only the late statements write (P): the early ones must not write what it reads
    # (checked above), and the first gemm's accumulators must not be what it reads
    if id(first_ends[-1].acc) in gemm_regs:
        return None
    return {"early": early, "late": late, "gemm": last, "first_acc": first_ends[-1].acc,
            "last_acc": ends[0].acc, "reads": begins[0].reads}


def rotatable(body) -> bool:
    """Whether a deferred loop body has the form :func:`parts` rotates (without its split): exactly two gemms,
    the last deferred and reading registers as an operand (the early issue's split finds the rest)."""
    begins = [x for x in collect(body, MatrixSync) if x.phase == "begin"]
    ends = [x for x in collect(body, MatrixSync) if x.phase == "end"]
    return len(begins) == 2 and len(ends) == 2 and bool(begins[1].reads) and ends[1].pending == 1 \
        and ends[0].pending == 0


def commit_only(item):
    """``item`` (a gemm) with its closing synchronization a commit only and no wait for its last iteration."""
    def fix(x):
        if isinstance(x, MatrixSync) and x.phase == "end":
            return x.with_(pending=-1)
        if isinstance(x, If) and isinstance(x.then, MatrixSync) and x.then.phase == "wait" and x.orelse is None:
            return Seq([])
        if isinstance(x, If) and isinstance(x.then, PerThread) and isinstance(x.then.body, MatrixSync) \
                and x.then.body.phase == "wait" and x.orelse is None:
            return Seq([])
        return None

    return rewrite(item, fix)


def waits_for_itself(item):
    """``item`` (a gemm) closing with a wait for every group, no wait for a last iteration."""
    def fix(x):
        if isinstance(x, MatrixSync) and x.phase == "end":
            return x.with_(pending=0)
        if isinstance(x, If) and isinstance(x.then, MatrixSync) and x.then.phase == "wait" and x.orelse is None:
            return Seq([])
        return None

    return rewrite(item, fix)


def wait(spelling: str, acc, pending: int, span):
    """A wait for the matrix unit's groups (all but ``pending``), the accumulators ``acc`` fenced after."""
    return PerThread(MatrixSync(spelling, "wait", acc, pending=pending, span=span), span=span)


def pin(spelling: str, reads: tuple, span):
    """The registers a gemm reads next, just written (its A operand, P): an emitter may keep them in the form
    the instruction reads across the loop's back edge (D59: the packed pairs; else nothing)."""
    return PerThread(MatrixSync(spelling, "pin", None, reads=tuple(reads), span=span), span=span)


def with_turn(item, turns, take: bool, give: bool):
    """``item`` (a gemm) inside a turn of the consumer groups (tilecore.pingpong): taken after its opening
    synchronization where ``take``, passed right after its commit where ``give`` (a gemm that waits for itself
    commits, passes, then waits). D59: one turn for iteration k's first gemm and iteration k - 1's last."""
    if turns is None:
        return item
    threads, groups = turns

    def fix(x):
        if not isinstance(x, MatrixSync):
            return None
        if x.phase == "begin" and take:
            return Seq([x, Turn("take", threads, groups, span=x.span)], span=x.span)
        if x.phase != "end" or not give:
            return None
        passed = Turn("pass", threads, groups, span=x.span)
        if x.pending:
            return Seq([x, passed], span=x.span)
        return Seq([x.with_(pending=-1), passed, MatrixSync(x.spelling, "wait", x.acc, span=x.span)], span=x.span)

    return rewrite(item, fix)


def masks_after(init: list, acc):
    """``(clear, after)`` for the statements before the first gemm where they are D55's split mask of its
    accumulators ``acc`` (``if (k < E) acc = 0 else acc = select(mask, 0, X)``): ``clear`` the unmasked branch
    alone (every iteration clears: an assembler folds the zeros into the first instruction, as without a mask) and
    ``after`` the masked branch as ``if (k < E) {} else acc = select(mask, acc, X)`` after the gemm's wait (tilecore.
    pipeline_mask_after_gemm). The gemm adds its products to 0 either way; where the mask is false the result is X
    (-inf) rather than X plus the products (the same for finite scores). None where the statements are not of
    that form."""
    if len(init) != 1 or not isinstance(init[0], If) or init[0].orelse is None:
        return None
    branch = init[0]

    def stores(s):
        return [x for x in collect(s, Store)]

    then_st, else_st = stores(branch.then), stores(branch.orelse)
    if not then_st or len(then_st) != len(else_st):
        return None
    if any(x.buffer is not acc or const_value(x.value) != 0 for x in then_st):
        return None
    if any(x.buffer is not acc or not isinstance(x.value, Select) or const_value(x.value.t) != 0 for x in else_st):
        return None

    def fix(x):
        if isinstance(x, Store) and x.buffer is acc:
            return x.with_(value=Select(x.value.cond, BufferLoad(acc, tuple(x.indices)), x.value.f))
        return None

    masked = rewrite(branch.orelse, fix)
    # the same condition with an empty first branch: the guard pass prunes it where the prover shows it holds
    return [branch.then], If(branch.cond, Seq([]), masked, span=branch.span)


def scale_split(rot: dict, crossed: list) -> tuple[list, list] | None:
    """D87 (tilecore.pipeline_scale_in_turn): ``(moved, rest)`` of ``rot["late"]``: ``moved`` the late statements that
    name the last gemm's accumulators and none of the registers it reads (O's rescale, not P's conversion), to run
    right before the rotated last gemm that adds to those accumulators (one iteration later, in the turn where the
    gemms issue), ``rest`` the others in their order. None where nothing moves or a moved statement shares a buffer
    with a statement it would move past: the late statements after it, and ``crossed`` (what runs between the end of
    an iteration and the rotated gemm of the next: the pin, the late group's wait, the first gemm and what comes
    before it), so every buffer sees the same operations in the same order (the same bits)."""
    acc, reads = id(rot["last_acc"]), {id(b) for b in rot["reads"]}
    late = rot["late"]
    moved = [i for i, x in enumerate(late) if acc in buffers_named(x) and not buffers_named(x) & reads]
    if not moved:
        return None
    for i in moved:
        mine = buffers_named(late[i])
        past = [x for j, x in enumerate(late) if j > i and j not in moved] + list(crossed)
        if any(buffers_named(x) & mine for x in past):
            return None
    return [late[i] for i in moved], [x for i, x in enumerate(late) if i not in moved]
