"""Lowering: graph -> kernels (fusion, scheduling) -> loop IR -> LLVM IR (CPU) / NVPTX (PTX)."""
