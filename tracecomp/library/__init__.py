"""Composite programs, written against the op namespace: composites, nn composites, einsum,
resampling, windows, indexing and assignment."""
