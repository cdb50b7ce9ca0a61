"""The loop IR: statements and expressions, their builders, checker, MLIR printer and interpreter."""
