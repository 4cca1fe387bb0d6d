"""tilecore-conformance: one suite, driven by capability data, that checks every backend the same way.

    tilecore conformance run --target cpu -n auto --report out/
    pytest --tilecore-target=cpu
"""
__version__ = "0.1.0"
