"""Timing and checking compiled kernels (TileLang's ``kernel.get_profiler()``)."""
from __future__ import annotations

import statistics

from ..compiler.binding import bind


def timed_runs(run, sync, n_warmup: int, n_repeat: int, clock) -> list:
    """``run()`` ``n_warmup`` times, then ``n_repeat`` times each timed with ``clock`` (seconds) up to
    ``sync()`` returning: the milliseconds of each timed run."""
    for _ in range(n_warmup):
        run()
    sync()
    times = []
    for _ in range(n_repeat):
        t0 = clock()
        run()
        sync()
        times.append((clock() - t0) * 1e3)
    return times


class Profiler:
    def __init__(self, kernel, tensor_supply_type=None):
        self.kernel = kernel
        self.supply = tensor_supply_type  # a tilecore.TensorSupplyType; None: Auto (normal / small ints / 0-1)

    def _inputs(self, input_tensors, dynamic_symbolic_constraints=None):
        if input_tensors is not None:
            return list(input_tensors)
        from ..utils.tensor import TensorSupplyType, supply_inputs

        return supply_inputs(self.kernel.signature, self.supply or TensorSupplyType.Auto,
                             self.kernel.runtime.tensor_device, dynamic_symbolic_constraints)

    def do_bench(self, func=None, warmup: int = 25, rep: int = 100, n_warmup: int = 0, n_repeat: int = 0,
                 input_tensors=None, dynamic_symbolic_constraints=None, return_mode: str = "median") -> float:
        """Time ``func`` (default: the kernel) in milliseconds; median over ``rep`` runs after ``warmup``.

        ``warmup``/``rep`` count runs (TileLang counts milliseconds on GPUs; a CPU backend has no event
        timer, so counts are the honest unit here).
        """
        k = self.kernel
        args = self._inputs(input_tensors, dynamic_symbolic_constraints)
        runtime = k.runtime
        clock = runtime.timer()
        if func is None:
            program = k._load()
            b = bind(k.signature, tuple(args), k.name, runtime.tensor_device)

            def run():
                program.launch(b.buffers, b.ints, b.floats)
            sync = program.synchronize
        else:
            def run():
                func(*args)
            sync = k._load().synchronize
        times = timed_runs(run, sync, max(n_warmup, warmup), max(1, n_repeat or rep), clock)
        if return_mode == "mean":
            return statistics.fmean(times)
        if return_mode == "min":
            return min(times)
        return statistics.median(times)

    def assert_allclose(self, reference_program, input_tensors=None, atol: float = 1e-2, rtol: float = 1e-2,
                        max_mismatched_ratio: float = 0.0):
        """Run the kernel and ``reference_program`` on the same inputs and compare every output."""
        import torch

        args = self._inputs(input_tensors)
        out = self.kernel(*args)
        ref = reference_program(*args)
        outs = out if isinstance(out, (list, tuple)) else [out]
        refs = ref if isinstance(ref, (list, tuple)) else [ref]
        for o, r in zip(outs, refs):
            torch.testing.assert_close(torch.as_tensor(o).double(), torch.as_tensor(r).double(), atol=atol, rtol=rtol)
