"""Tensors as data: the Tensor class, its factories, pytrees of tensors, op results and checkpoints."""
