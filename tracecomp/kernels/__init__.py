"""Reference kernels: every non-composite op of ops.yaml executed on NumPy."""
