"""TileLang's ``tilelang.autotuner``: ``autotune``, ``AutoTuner``, ``set_autotune_inputs`` (tilecore.autotune)."""
from ..autotune import AutoTuner, autotune, get_autotune_inputs, set_autotune_inputs

__all__ = ["AutoTuner", "autotune", "get_autotune_inputs", "set_autotune_inputs"]


def __getattr__(name):
    from ..errors import not_provided

    raise not_provided("tilecore.autotuner", name)
