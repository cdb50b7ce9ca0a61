"""Loops and branches in the graph: tc.scan, tc.fori_loop, tc.while_loop and tc.cond.

functions.py is the API; primitives.py traces functions into regions and binds region
ops through the dispatch keys; autodiff.py and batching.py hold their gradient and vmap
rules.  The ops themselves, and what their regions take and yield: ir/regions.py.
"""
from .functions import ControlFlowError, cond, fori_loop, scan, while_loop

__all__ = ["ControlFlowError", "cond", "fori_loop", "scan", "while_loop"]
