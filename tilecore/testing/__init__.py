"""Test helpers for kernel authors (TileLang's ``tilelang.testing``)."""
from __future__ import annotations

import random
import sys

from ..utils.tensor import torch_assert_close

__all__ = ["set_random_seed", "torch_assert_close", "main"]


def set_random_seed(seed: int = 42) -> None:
    """Seed Python's, numpy's and torch's generators (those that are installed)."""
    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:
        pass
    try:
        import torch

        torch.manual_seed(seed)
    except ImportError:
        pass


def main() -> None:
    """Run the calling file's tests with pytest (``if __name__ == "__main__": tilecore.testing.main()``)."""
    import pytest

    sys.exit(pytest.main([sys.modules["__main__"].__file__, *sys.argv[1:]]))


def __getattr__(name):
    from ..errors import not_provided

    raise not_provided("tilecore.testing", name)
