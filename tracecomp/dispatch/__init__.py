"""Dispatch: the dispatcher and its keys, the eager CPU kernels, the tracer and the batching key."""
