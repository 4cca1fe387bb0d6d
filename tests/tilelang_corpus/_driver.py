"""What the corpus drivers share: seeded inputs and float64 references. Not part of any ported kernel."""
from __future__ import annotations

import torch

torch.manual_seed(0)


def randn(*shape, dtype=torch.float16):
    return torch.randn(*shape, dtype=torch.float64).to(dtype)


def f64(t):
    return t.detach().to(torch.float64)
