"""The tile IR: expressions, buffers, statements, kernels, and the tools passes use on them.

This package is the IR substrate behind a façade: the rest of tilecore (and every backend) uses only
the names exported here, so the substrate can change in one place. See docs/decisions.md.
"""
from .bounds import int_bounds, loop_range
from .buffer import SCOPES, Buffer, Region
from .dtypes import DTYPES, DType, canonical, is_float, is_int, max_value, min_value, promote
from .expr import (ATOMIC_OPS, INDEX, MEMORY_ORDERS, MEMORY_SCOPES, AtomicRet, BinOp, BufferLoad, Call, Cast, Cmp, Expr, FloatImm, IntImm, Logic, Select, ShuffleIndex,
                   ShuffleWidth, ShuffleXor, ThreadIndex, Var, as_expr, binary, cast, compare, const, const_value, logic_and, logic_not, logic_or,
                   maximum, minimum, same, select, walk_expr)
from .printer import expr_str, func_str
from .simplify import prove_equal, simplify
from .stmt import (LOOP_KINDS, Allocate, Assert, Assume, AsyncCommit, AsyncCopy, AsyncWait, Atomic, Barrier, Bind, Break,
                   BulkCopy, BulkFence, BulkStore, BulkStoreWait, Collective, Continue, CopyBarrierArrive, Fence, GroupBarrier, PeerStore, CopyBarrierInit, CopyBarrierWait, For, Hint, If, KernelLaunch, MatrixLoad, MatrixOp, MatrixStore, MatrixSync, Param, PerThread, Print, PrimFunc, Seq, Specialized, StageRelease,
                   Stmt, Turn, Store, TileOp, VectorStore, free_vars, seq)
from .visit import children, collect, loop_nest, rewrite, stmt_exprs, walk

__all__ = [n for n in dir() if not n.startswith("_")]
