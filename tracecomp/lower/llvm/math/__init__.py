"""Vectorizable polynomial math (exp, log, trig, special functions) in LLVM IR."""
