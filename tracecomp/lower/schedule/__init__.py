"""Graph -> loop IR: fusion groups, pointwise, reductions, rows, matmul, donation."""
