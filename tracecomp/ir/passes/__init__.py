"""Graph-to-graph passes over the IR, and the PassManager that runs a list of them.

Each pass states in its module docstring what holds before and after it; all of them are
built on the op-by-op rewrite driver in rewrite.py.
"""
from .control import control
from .cse import cse
from .dce import dce
from .fold import fold_constants
from .manager import PassManager
from .narrow_products import narrow_products
from .simplify import simplify
from .summed_products import summed_products
from .widen_half import widen_half

__all__ = ["PassManager", "control", "cse", "dce", "fold_constants", "narrow_products", "simplify", "summed_products", "widen_half"]
