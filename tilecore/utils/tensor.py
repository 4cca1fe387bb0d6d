"""Input tensors for profiling and tuning, and a tolerant comparison (TileLang's ``tilelang.utils.tensor``).

torch is imported only when a tensor is made or compared."""
from __future__ import annotations

from enum import Enum


class TensorSupplyType(Enum):
    """How ``kernel.get_profiler(tensor_supply_type=...)`` fills the kernel's inputs."""

    Integer = 1   # small integers (exact in every dtype)
    Uniform = 2   # uniform in [-1, 1)
    Normal = 3    # standard normal
    Randn = 4     # standard normal
    Zero = 5
    One = 6
    Auto = 7      # Normal for floats, small integers for ints, 0/1 for bool


def make_tensor(shape, dtype: str, supply: TensorSupplyType = TensorSupplyType.Auto, device="cpu", generator=None):
    """One tensor of the tilecore dtype ``dtype`` filled as ``supply`` says."""
    import torch

    from ..compiler.binding import torch_dtype

    dt = torch_dtype(dtype)
    shape = tuple(int(s) for s in shape)
    if supply is TensorSupplyType.Zero:
        return torch.zeros(shape, dtype=dt, device=device)
    if supply is TensorSupplyType.One:
        return torch.ones(shape, dtype=dt, device=device)
    if dt == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool().to(device)
    if not dt.is_floating_point or supply is TensorSupplyType.Integer:
        low, high = (0, 4) if not dt.is_signed or not dt.is_floating_point and dtype.startswith("uint") else (-4, 4)
        return torch.randint(low, high, shape, generator=generator).to(dt).to(device)
    if supply is TensorSupplyType.Uniform:
        return (torch.rand(shape, generator=generator) * 2 - 1).to(dt).to(device)
    return torch.randn(shape, generator=generator).to(dt).to(device)


def supply_inputs(sig: dict, supply: TensorSupplyType, device="cpu", symbols: dict | None = None) -> list:
    """The inputs of a kernel with signature ``sig`` (its outputs are allocated by the call)."""
    import torch

    from ..errors import ArgumentError

    g = torch.Generator().manual_seed(0)
    out = []
    for i, p in enumerate(sig["params"]):
        if i in sig["out_idx"] or p.get("workspace"):
            continue
        if p["kind"] != "buffer":
            out.append(1.0 if p["dtype"].startswith(("float", "bfloat")) else 1)
            continue
        shape = []
        for s in p["shape"]:
            if isinstance(s, str):
                if not symbols or s not in symbols:
                    raise ArgumentError(f"argument {p['name']!r} has the dynamic dimension {s!r}; pass input_tensors "
                                        "or dynamic_symbolic_constraints={...} to the profiler")
                s = symbols[s]
            shape.append(s)
        out.append(make_tensor(shape, p["dtype"], supply, device, g))
    return out


def get_tensor_supply(supply_type: TensorSupplyType = TensorSupplyType.Integer):
    """A function ``(shape, dtype) -> tensor`` on the CPU (TileLang's takes a kernel parameter)."""
    return lambda shape, dtype: make_tensor(shape, str(dtype), supply_type)


def torch_assert_close(tensor_a, tensor_b, rtol: float = 1e-2, atol: float = 1e-3, max_mismatched_ratio: float = 0.001,
                       verbose: bool = False, equal_nan: bool = True, check_device: bool = True, check_dtype: bool = False,
                       base_name: str = "LHS", ref_name: str = "RHS"):
    """Pass when at most ``max_mismatched_ratio`` of the elements differ by more than ``atol + rtol * |ref|``."""
    import torch

    a = torch.as_tensor(tensor_a)
    b = torch.as_tensor(tensor_b)
    if a.shape != b.shape:
        raise AssertionError(f"{base_name} has shape {tuple(a.shape)}, {ref_name} has {tuple(b.shape)}")
    if check_device and a.device != b.device:
        raise AssertionError(f"{base_name} is on {a.device}, {ref_name} on {b.device}")
    if check_dtype and a.dtype != b.dtype:
        raise AssertionError(f"{base_name} is {a.dtype}, {ref_name} is {b.dtype}")
    a64, b64 = a.double().cpu(), b.double().cpu()
    bad = ~torch.isclose(a64, b64, rtol=rtol, atol=atol, equal_nan=equal_nan)
    n = int(bad.sum())
    allowed = int(max_mismatched_ratio * a64.numel())
    if verbose or n > allowed:
        worst = float((a64 - b64).abs().nan_to_num(float("inf")).max()) if a64.numel() else 0.0
        msg = (f"{n} of {a64.numel()} elements of {base_name} and {ref_name} differ beyond atol={atol}, rtol={rtol} "
               f"(at most {allowed} allowed); largest difference {worst:g}")
        if n > allowed:
            raise AssertionError(msg)
        print(msg)
