"""Shared, vendor-neutral source emitters that backends subclass (see STYLE: emitters are data)."""
from .abi import KernelABI, abi_of, host_expr, single_launch
from .cfamily import CFamilyEmitter, EmitState
from .simtcpp import SIMTCppEmitter

__all__ = ["CFamilyEmitter", "EmitState", "KernelABI", "SIMTCppEmitter", "abi_of", "host_expr", "single_launch"]
