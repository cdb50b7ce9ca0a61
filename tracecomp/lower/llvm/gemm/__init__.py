"""The packed matmul: blocking, packing and the register-tile micro-kernel."""
