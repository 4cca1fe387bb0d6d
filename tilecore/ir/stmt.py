"""Statements of the tile IR and the function that holds them.

The IR has two levels in one set of nodes. After parsing, a kernel body holds :class:`TileOp`
statements (``copy``, ``gemm``, ``reduce``...) over buffer regions; tile-op lowering replaces each of
them with loops over scalar statements. Every statement carries the :class:`~tilecore.errors.Span` of
the source line it came from, so any pass can report an error at the user's line.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import Span
from .buffer import Buffer
from .expr import Expr, Var, walk_expr

LOOP_KINDS = ("serial", "parallel", "pipelined", "unroll", "vectorized")


@dataclass(eq=False)
class Stmt:
    span: Span | None = field(default=None, kw_only=True)

    def with_(self, **changes) -> "Stmt":
        return replace(self, **changes)


@dataclass(eq=False)
class Seq(Stmt):
    body: list


@dataclass(eq=False)
class For(Stmt):
    """``for var in range(start, start + extent)``; ``kind`` says how iterations may be scheduled.

    ``parallel`` iterations are independent (``T.Parallel``); ``pipelined`` is a serial loop that a
    backend may software-pipeline (``annotations['num_stages']``).
    """

    var: Var
    start: Expr
    extent: Expr
    kind: str
    body: Stmt
    annotations: dict = field(default_factory=dict)


@dataclass(eq=False)
class If(Stmt):
    cond: Expr
    then: Stmt
    orelse: Stmt | None = None


@dataclass(eq=False)
class Store(Stmt):
    buffer: Buffer
    indices: tuple
    value: Expr


@dataclass(eq=False)
class Bind(Stmt):
    """Bind an immutable scalar ``var = value`` for the rest of the enclosing block."""

    var: Var
    value: Expr


@dataclass(eq=False)
class Allocate(Stmt):
    """Declare a non-global buffer; ``init`` fills a ``var`` buffer when it is declared. ``reuses``: names of block
    buffers declared before it whose memory it may take (none of them is used once this one is first written: a
    pass that knows so says it, D75); a code generator that lays block memory out places it over them where they
    lie together and hold it, else beside them."""

    buffer: Buffer
    init: Expr | None = None
    reuses: tuple = ()


@dataclass(eq=False)
class Atomic(Stmt):
    """``buffer[indices] = op(buffer[indices], value)`` atomically; op is add, max or min."""

    op: str
    buffer: Buffer
    indices: tuple
    value: Expr


@dataclass(eq=False)
class Fence(Stmt):
    """A memory fence of the executing thread: with ``order`` ``"release"`` its memory accesses before the fence
    are ordered before its later writes (an atomic's that tells others to read), with ``"acquire"`` its reads
    after the fence after the earlier reads (the atomic that told it to read), ``"acq_rel"`` both; ``scope``
    ``"block"`` orders them for the block's threads, ``"device"`` for every thread of the launch. Every thread
    that runs it fences its own accesses (a block barrier after a release fence lets one thread's atomic publish
    the whole block's writes). An emitter spells it or refuses with a CompileError (decision D69)."""

    scope: str = "device"
    order: str = "acq_rel"

    def __post_init__(self):
        from .expr import MEMORY_ORDERS, MEMORY_SCOPES

        if self.order not in MEMORY_ORDERS[1:]:
            raise ValueError(f"fence order {self.order!r}: expected one of {', '.join(MEMORY_ORDERS[1:])}")
        if self.scope not in MEMORY_SCOPES:
            raise ValueError(f"fence scope {self.scope!r}: expected one of {', '.join(MEMORY_SCOPES)}")


#: a block group's barrier phases (:class:`GroupBarrier`) and the memory order each may take
GROUP_BARRIER_ORDERS = {"arrive": ("release", "relaxed"), "wait": ("acquire",), "sync": ("acq_rel",)}


@dataclass(eq=False)
class GroupBarrier(Stmt):
    """A barrier of the block group the launch's blocks form (``KernelLaunch.attrs["block_group"]``, D75): every
    thread of every block of the group runs it. ``"arrive"`` says this thread has come (``"release"``: its memory
    accesses before it, peer stores included, are seen by the group's threads after their wait; ``"relaxed"``:
    nothing ordered, only arrival: the form that says "this block has started" at the top of a kernel);
    ``"wait"`` waits until every thread of the group has arrived (``"acquire"``); ``"sync"`` is both. A thread
    arrives once between two waits. A target whose blocks are never co-resident refuses it by name."""

    phase: str = "sync"
    order: str = "acq_rel"

    def __post_init__(self):
        if self.phase not in GROUP_BARRIER_ORDERS:
            raise ValueError(f"group barrier phase {self.phase!r}: expected one of {', '.join(GROUP_BARRIER_ORDERS)}")
        if self.order not in GROUP_BARRIER_ORDERS[self.phase]:
            raise ValueError(f"group barrier {self.phase} order {self.order!r}: expected one of "
                             f"{', '.join(GROUP_BARRIER_ORDERS[self.phase])}")


@dataclass(eq=False)
class PeerStore(Stmt):
    """``buffer[indices ...] = values`` in the block memory of another block of the launch's block group: the block
    of rank ``rank`` (0 .. group size - 1, the blocks' linear index inside the group, x fastest), its copy of the
    block buffer ``buffer`` (every block of the kernel declares it). ``values`` are consecutive elements from
    ``indices`` (the last index counts up by one each; 1, 2 or 4 of them, one store on targets that store vectors).
    The store completes before a later :class:`GroupBarrier` arrive with release returns in the other block's
    eyes after its wait (D75); the other block must not have left the kernel before that wait. With ``barrier``:
    the store completes on the peer's transaction barrier ``barrier[barrier_index]`` (its bytes counted against what
    the peer announced with :class:`CopyBarrierArrive`), and a peer thread that waited for that barrier's phase sees
    it, with no group barrier between (the peer initialised the barrier before the group's blocks met)."""

    buffer: Buffer
    indices: tuple
    values: tuple
    rank: Expr
    barrier: Buffer | None = None
    barrier_index: Expr | None = None


@dataclass(eq=False)
class Print(Stmt):
    """Print a scalar (``value``) or a whole buffer (``buffer``) with a message."""

    message: str
    value: Expr | None = None
    buffer: Buffer | None = None


@dataclass(eq=False)
class Assert(Stmt):
    """Stop the kernel and raise :class:`KernelAssertionError` with ``message`` when ``cond`` is false.

    ``values`` (integer expressions, at most ``tilecore.errors.MAX_FAULT_VALUES``) are recorded when it
    fails and fill the ``{0}``, ``{1}``... places of ``message``; such an assertion is a checked-mode
    bounds check and raises :class:`~tilecore.errors.KernelRuntimeError` instead.
    """

    cond: Expr
    message: str
    values: tuple = ()


@dataclass(eq=False)
class Break(Stmt):
    pass


@dataclass(eq=False)
class Continue(Stmt):
    pass


@dataclass(eq=False)
class Barrier(Stmt):
    """Wait until every thread of the block arrives here; block-local memory writes before it are
    visible to every thread after it. Introduced by thread distribution (``tilecore.simt_distribute``).
    ``threads`` n > 0: only threads ``0 .. n-1`` take part (the consumers of a :class:`Specialized` block)."""

    threads: int = 0


@dataclass(eq=False)
class AsyncCopy(Stmt):
    """Start copying ``elements`` consecutive elements of global ``src`` from ``src_indices`` into block-local
    ``dst`` from ``dst_indices`` (both runs contiguous along the last dimension), without waiting; where
    ``pred`` is false the destination elements are zeroed instead (a load out of bounds gives 0) and the
    source is not read. Every thread issues its own copies: thread distribution leaves it inside the
    distributed parallel nest, like a Store. The copy lands at an :class:`AsyncWait` after the
    :class:`AsyncCommit` that closes its group; other threads see it after a :class:`Barrier` that
    follows that wait. Introduced by ``tilecore.plan_pipelines`` for targets with ``feature:async_copy``,
    where the planner proved both addresses aligned to ``elements`` elements."""

    dst: Buffer
    dst_indices: tuple
    src: Buffer
    src_indices: tuple
    elements: int
    pred: Expr


@dataclass(eq=False)
class AsyncCommit(Stmt):
    """Close the group of this thread's asynchronous copies issued since the last commit (every thread
    runs it; a group may be empty)."""


@dataclass(eq=False)
class AsyncWait(Stmt):
    """Wait until at most ``pending`` of this thread's committed copy groups are still in flight (every
    thread runs it). Other threads' copies are visible only after a following :class:`Barrier`."""

    pending: int


@dataclass(eq=False)
class BulkCopy(Stmt):
    """Start copying a box of global ``src`` into a whole shared tile, as one operation of one thread (the
    hardware's bulk tile copy): ``box[d]`` elements from ``starts[d]`` along each source dimension (the
    non-unit extents, in order, are the tile's rows and columns; elements outside the tensor arrive as 0)
    into ``dst[dst_indices..., :, :]``, stored in ``layout`` (a paneled
    :class:`~tilecore.layout.SharedLayout`: one bulk copy per panel). The copy completes on transaction
    barrier ``barrier[index]``, whose :class:`CopyBarrierArrive` announced its bytes; threads see it after a
    :class:`CopyBarrierWait` on that barrier. Introduced by ``tilecore.plan_pipelines`` on targets with
    ``feature:bulk_tensor_copy``; thread distribution issues it on one thread.

    ``when`` (plugin API 1.8): None where the compiler proved ``src`` fit for bulk copies (its rows whole
    16-byte units, its sizes positive); otherwise the condition over the kernel's integer arguments under
    which it is (the copy sits in the branch of a versioned loop that tests exactly this condition, the other
    branch copies per thread). A backend that describes ``src`` to the hardware at launch (a tensor map)
    evaluates it on the host and describes ``src`` only where it holds."""

    dst: Buffer
    dst_indices: tuple
    src: Buffer
    starts: tuple
    box: tuple
    layout: Any
    barrier: Buffer
    index: Expr
    when: Expr | None = None
    #: D80: 1 (the default) or the size of the launch's block group (``KernelLaunch.attrs["block_group"]``): the
    #: group's blocks load the same box together. The block of group rank ``r`` issues the ``r``-th of ``multicast``
    #: equal parts of the panels, each landing in every block of the group at the same offset of ``dst`` and
    #: completing on every block's ``barrier[index]`` (whose arrive announced the whole copy's bytes, as without
    #: it). Every block of the group runs the copy with the same starts (the planner proves it). A target without
    #: ``execution.cluster.multicast_copy`` refuses it by name.
    multicast: int = 1


@dataclass(eq=False)
class CopyBarrierInit(Stmt):
    """Initialise every transaction barrier of ``barrier`` (a shared buffer of barrier words) to complete a
    phase when ``count`` threads have arrived and the bytes they announced have landed. One thread runs
    it; a :class:`Barrier` must follow before any thread uses them."""

    barrier: Buffer
    count: int = 1


@dataclass(eq=False)
class CopyBarrierArrive(Stmt):
    """Arrive on transaction barrier ``barrier[index]``, announcing ``bytes`` of bulk copies that complete on
    it in this phase (one thread runs it, before or after issuing them)."""

    barrier: Buffer
    index: Expr
    bytes: int


@dataclass(eq=False)
class CopyBarrierWait(Stmt):
    """Wait until the phase of transaction barrier ``barrier[index]`` with parity ``parity`` (0 or 1) has
    completed: every byte announced has landed and is visible to this thread (every thread runs it)."""

    barrier: Buffer
    index: Expr
    parity: Expr
    #: only the thread that issues the bulk copies waits (it refills the stage once every thread released it:
    #: tilecore.pipeline_release_stages, D62); False: every thread
    issuer: bool = False


@dataclass(eq=False)
class StageRelease(Stmt):
    """Every consumer thread arrives on transaction barrier ``barrier[index]`` (no bytes): it is done reading
    the stage, which the producer of a :class:`Specialized` block may refill once every consumer arrived."""

    barrier: Buffer
    index: Expr
    #: D80: 1 (the default) or the size of the launch's block group: the thread arrives on ``barrier[index]`` in
    #: every block of the group (the group's producers refill a stage into every block: each waits until every
    #: block's consumers released it; the barrier's init counts the consumers of the whole group)
    group: int = 1


@dataclass(eq=False)
class Turn(Stmt):
    """Turns of ``groups`` groups of ``group_threads`` consecutive consumer threads (a warp-specialized block's
    warpgroups) on the block's matrix unit, inside their per-thread programs: ``phase`` ``"take"`` waits until it
    is this group's turn, ``"pass"`` hands it to the next group (round robin); ``"init"`` (before the loop that
    takes turns) gives the first group the first turn, ``"fini"`` (after it) takes back the turn the last group
    passed, so every pass is matched. Introduced by ``tilecore.plan_pipelines`` with ``tilecore.pingpong``
    (decision D55): one group's gemms are issued while the other runs its softmax."""

    phase: str
    group_threads: int
    groups: int


@dataclass(eq=False)
class BulkStore(Stmt):
    """Start storing the whole shared tile ``src`` (stored in ``layout``, a paneled
    :class:`~tilecore.layout.SharedLayout`: one bulk store per panel) into the box of global ``dst`` that starts at
    ``starts`` and spans ``box`` (the tile's rows and columns along the last two dimensions), as one operation
    of one thread (the hardware's bulk tile store); elements of the box outside ``dst`` are not written. The
    stores join one group of the issuing thread (closed here); a :class:`BulkStoreWait` of that thread waits for
    it. The threads' ordinary writes of ``src`` must be made visible to it: each writing thread runs a
    :class:`BulkFence`, then a :class:`Barrier`. Introduced by ``tilecore.stage_bulk_stores`` (pass config
    ``tilecore.bulk_store``) on targets with ``feature:bulk_tensor_copy``; thread distribution issues it on one
    thread (plugin API 1.9)."""

    dst: Buffer
    starts: tuple
    box: tuple
    src: Buffer
    layout: Any
    #: ``(first, count)``: only panels ``first .. first + count - 1`` of the tile (``first`` an expression; D75: each
    #: block of a group stores the panels whose sums it owns); None: every panel
    panels: tuple | None = None
    #: ``(first, end, rows)``: only cells ``first .. end - 1`` (expressions) of the tile cut into cells of ``rows``
    #: rows (a multiple of 8) by one panel, numbered panel-major (cell ``c``: panel ``c // (tile rows / rows)``, rows
    #: from ``(c % (tile rows / rows)) rows``; D78: each block of a group stores the cells whose sums it owns); None:
    #: every panel (or ``panels``)
    cells: tuple | None = None


@dataclass(eq=False)
class BulkStoreWait(Stmt):
    """The thread that issued :class:`BulkStore` groups waits until at most ``pending`` of them still read
    their shared tiles (``read``: the tile may then be written again) or, with ``read`` False, are still
    running (their writes done). Thread distribution runs it on the issuing thread, then a :class:`Barrier`
    (plugin API 1.9)."""

    pending: int = 0
    read: bool = True


@dataclass(eq=False)
class BulkFence(Stmt):
    """This thread's ordinary writes of shared memory become visible to bulk stores issued after a following
    :class:`Barrier` (hardware whose bulk-copy engine reads shared memory through another path needs a fence;
    others spell it as nothing). Every thread runs it (plugin API 1.9)."""


@dataclass(eq=False)
class Specialized(Stmt):
    """A warp-specialized block: threads ``0 .. consumers-1`` run ``consumer`` (the kernel's own work), the
    block's last ``threads - consumers`` threads (one group, e.g. a warpgroup, so a backend may move
    registers from it to the consumers) form the producer, whose first thread runs ``producer`` (the bulk
    copies of a pipelined loop, each stage issued once the consumers released its buffer). Introduced by
    ``tilecore.plan_pipelines`` on targets with ``feature:warp_specialization``; thread distribution spreads
    ``consumer`` over the consumers only (its barriers are theirs alone) and leaves ``producer`` as it is."""

    producer: Stmt
    consumer: Stmt
    consumers: int


@dataclass(eq=False)
class Collective(Stmt):
    """An operation that every thread of the block executes together, e.g. a block-wide matrix multiply
    through a backend's device library: ``name(*args)`` specialised by the static ``attrs``.

    ``args`` are :class:`~tilecore.ir.buffer.Region` objects (an emitter passes the address of the
    region's first element) and scalar expressions (passed by value). Tile-op lowering produces it
    (a backend intrinsic); thread distribution (``tilecore.simt_distribute``) runs it on every thread,
    records their number in ``threads`` and puts a :class:`Barrier` before and after it, so the
    callee may read block-local memory written before it and its writes are visible after it. An
    emitter that runs a block as one thread may call it once; one that has no such library rejects it.
    """

    name: str
    args: tuple
    attrs: dict = field(default_factory=dict)
    threads: int | None = None


@dataclass(eq=False)
class PerThread(Stmt):
    """Every thread of the block runs ``body`` as its own program: :class:`~tilecore.ir.ThreadIndex` says
    which thread it is, and ``register`` buffers (a fragment's registers, laid out by a
    :class:`~tilecore.layout.FragmentLayout`) are its private arrays. Produced by fragment lowerings on
    targets whose blocks are groups of threads; thread distribution runs it on every thread as it is.
    ``attrs`` record what the lowering did (e.g. the layout), for IR dumps.
    """

    body: Stmt
    attrs: dict = field(default_factory=dict)


@dataclass(eq=False)
class MatrixOp(Stmt):
    """One instruction of a registered matrix unit (:class:`~tilecore.layout.MatrixUnit`), run by the
    unit's group of threads inside a :class:`PerThread`: ``c[c_offset : c_offset + unit.c.regs] +=
    a[a_offset : ...] x b[b_offset : ...]`` over register buffers laid out by the unit's layouts.
    ``spelling`` is the unit's key for the backend's emitter.

    An operand the unit's instruction reads from shared memory itself (``MatrixUnit.attrs["operand_sources"]``)
    has an origin instead of registers: ``a_origin`` / ``b_origin`` is a load of the operand's element (0, 0)
    in the shared tile (its buffer is the one to address: passes that multi-buffer the tile rewrite the origin,
    not ``a`` / ``b``, which then only name it), ``attrs["a_trans"]`` / ``["b_trans"]`` say the tile stores
    the operand transposed (A as K x M, B as N x K), and the tile's shared layout is the paneled one the
    memory slot gives it (``tilecore.passes.matrix.swizzle_operand_tiles``)."""

    spelling: str
    c: Buffer
    c_offset: int
    a: Buffer
    a_offset: int
    b: Buffer
    b_offset: int
    a_origin: Expr | None = None
    b_origin: Expr | None = None
    attrs: dict = field(default_factory=dict)


@dataclass(eq=False)
class MatrixSync(Stmt):
    """The bracket around the instructions of one ``T.gemm`` on an asynchronous matrix unit
    (``MatrixUnit.attrs["async"]``), inside a :class:`PerThread`: ``phase`` ``"begin"`` before the first
    (order the threads' earlier register and shared-memory writes before the unit reads them), ``"end"``
    after the last (wait until the unit has written the accumulators and read its operands; with ``pending``
    n, until at most the n most recent gemms' instructions still run: the pipeline planner keeps a loop's
    last gemm running while the next stage is copied, and after the loop a ``"wait"`` phase (the same wait,
    nothing to close) finishes it). ``acc`` is the accumulators' register buffer."""

    spelling: str
    phase: str
    acc: Buffer | None = None
    pending: int = 0
    meet: bool = True  #: "begin": the threads may have written what the unit reads (order and meet first)
    #: "begin": register buffers the gemm's instructions read as operands (A in registers: FlashAttention's P),
    #: for an emitter that pins their last writes before the unit's fence (D59; empty: none or not known)
    reads: tuple = ()


@dataclass(eq=False)
class MatrixLoad(Stmt):
    """Load one operand of a matrix unit instruction into registers, inside a :class:`PerThread`:
    ``dst[dst_offset : dst_offset + layout.regs]`` gets, register by register, the elements the unit's
    ``operand`` layout (``"a"`` or ``"b"``) assigns to the thread's ``lane``, from the tile of ``src`` whose
    operand element (0, 0) is ``origin`` (a load of ``src``). ``trans``: ``src`` stores the operand
    transposed (A as K x M, B as N x K). ``align`` is what the lowering proves of the origin: its last
    index is a multiple of ``align`` elements. ``fallback`` is the same load as one store per register;
    an emitter with a spelling for ``spelling`` (the unit's key) may emit that instead (e.g. one
    cooperative instruction of the unit's group), else it emits ``fallback``."""

    spelling: str
    operand: str
    dst: Buffer
    dst_offset: int
    origin: Expr
    lane: Expr
    trans: bool
    align: int
    fallback: Stmt
    attrs: dict = field(default_factory=dict)


@dataclass(eq=False)
class VectorStore(Stmt):
    """``buffer[indices[:-1], indices[-1] + k] = values[k]`` for ``k < lanes`` as ONE access of ``lanes``
    consecutive elements (``lanes * dtype.bytes`` bytes, at most 16). Made by ``tilecore.vectorize_stores`` from a
    run of element stores of a thread's registers where the prover shows the first element's offset is a
    multiple of ``lanes`` (the address is aligned to the vector's bytes, given a base pointer aligned to 16
    bytes: a backend that spells it makes the launch check that) and every store of the run happens under
    the same condition. ``fallback`` is the same as ``lanes`` element stores, in address order: an emitter
    without a vector spelling emits it (every walker sees it, like :class:`MatrixLoad`'s)."""

    buffer: Buffer
    indices: tuple
    values: tuple
    fallback: Stmt
    #: True where the values are ``lanes`` consecutive elements of one block-memory buffer (a shared tile, or a
    #: fragment kept in block memory) of the stored dtype, the first's offset proven a multiple of ``lanes`` (a
    #: block buffer starts 16-byte aligned):
    #: an emitter may read them as one access too (``tilecore.vectorize_stores`` on a shared -> global copy)
    vector_load: bool = False

    @property
    def lanes(self) -> int:
        return len(self.values)


@dataclass(eq=False)
class MatrixStore(Stmt):
    """Four 8x8 matrices of 16-bit elements stored from a group of 32 threads' registers to shared memory by one
    cooperative instruction, inside a :class:`PerThread` (the inverse of the operand load a :class:`MatrixLoad`
    may be spelled as). Thread ``l`` of the group (``l = thread index % 32``) holds in ``values[2m], values[2m + 1]``
    the pair at row ``l / 4``, columns ``2 (l % 4)`` and ``+ 1`` of matrix ``m``, and gives in ``indices`` (of
    ``buffer``, a shared tile) the element at column 0 of row ``l % 8`` of matrix ``l / 8``; each matrix row is 8
    consecutive elements of one 16-byte unit. Made by ``tilecore.matrix_stores`` from four pair
    :class:`VectorStore` of every thread after it checked that pattern for every thread of the block;
    ``fallback`` holds those vector stores: an emitter without a spelling emits it (plugin API 1.10)."""

    buffer: Buffer
    indices: tuple
    values: tuple
    fallback: Stmt


@dataclass(eq=False)
class Assume(Stmt):
    """``T.assume(cond)``: the author promises that ``cond`` holds from here to the end of the enclosing block
    (TileLang's meaning: a fact for the compiler, not a check). The bounds and divisibility prover uses it
    (``tilecore.guard_accesses``, the pipeline planner); ``tilecore.guard_accesses`` removes it, or, in checked
    mode, turns it into an :class:`Assert` that names the user's line. It emits no code."""

    cond: Expr


@dataclass(eq=False)
class Hint(Stmt):
    """A scheduling hint a backend may honour or ignore: ``use_swizzle``, ``annotate_layout``..."""

    kind: str
    payload: dict


@dataclass(eq=False)
class TileOp(Stmt):
    """A block-wide tile operation over regions, lowered through the target's intrinsic table.

    ``op`` names it (``copy``, ``fill``, ``gemm``, ``reduce``, ``cumsum``, ``atomic``); ``args`` are
    :class:`~tilecore.ir.buffer.Region` objects and expressions; ``attrs`` hold op options.
    """

    op: str
    args: tuple
    attrs: dict = field(default_factory=dict)


@dataclass(eq=False)
class KernelLaunch(Stmt):
    """``with T.Kernel(*grid, threads=...) as block_vars``: the body runs once per block."""

    grid: tuple
    block_vars: tuple
    threads: tuple
    body: Stmt
    attrs: dict = field(default_factory=dict)


@dataclass(eq=False)
class Param:
    """A kernel parameter: a global buffer, or a scalar ``var``. A ``workspace`` buffer is a
    ``T.alloc_global``: the call allocates it (zero-filled), the caller neither passes nor sees it."""

    name: str
    buffer: Buffer | None = None
    var: Var | None = None
    workspace: bool = False

    @property
    def is_buffer(self) -> bool:
        return self.buffer is not None


@dataclass(eq=False)
class PrimFunc:
    """A kernel: parameters, a body, and attributes passes record (hints, resource use).

    ``attrs["kept_workspaces"]`` (decision D69): global buffers of static shapes that are no parameter: the
    runtime gives each launch one set per device and stream, zero-filled where first used and KEPT across
    calls (no fill per call), so a kernel that uses one must leave what it relies on as it found it (a split
    tile's arrival counter is reset by the tile's last block). Launches on one stream run one after another;
    launches on two streams get two sets. A backend whose code generator declares none refuses the kernel."""

    name: str
    params: list
    body: Stmt
    attrs: dict = field(default_factory=dict)
    span: Span | None = None
    source: str = ""

    def with_body(self, body: Stmt, **attrs: Any) -> "PrimFunc":
        return PrimFunc(self.name, self.params, body, {**self.attrs, **attrs}, self.span, self.source)

    def shape_vars(self) -> list:
        """Symbolic dimensions of the parameters, in first-appearance order."""
        seen: list = []
        for p in self.params:
            if p.buffer is None:
                continue
            for s in p.buffer.shape:
                for v in free_vars(s):
                    if not any(v is x for x in seen):  # `in` would compare with ==, which builds IR
                        seen.append(v)
        return seen

    def script(self) -> str:
        from .printer import func_str

        return func_str(self)

    def __repr__(self) -> str:
        return f"<PrimFunc {self.name}>"


def free_vars(e) -> list:
    out: list = []
    walk_expr(e, lambda x: out.append(x) if isinstance(x, Var) and not any(x is y for y in out) else None)
    return out


def seq(stmts: list) -> Stmt:
    flat: list = []
    for s in stmts:
        if isinstance(s, Seq):
            flat.extend(s.body)
        elif s is not None:
            flat.append(s)
    return flat[0] if len(flat) == 1 else Seq(flat)
