"""Ahead of time: tc.export (a shared library and C header, or PTX for CUDA) and tc.load."""
