"""Core types every stage shares: errors, dtypes, tensor types, symbolic sizes, logging, timings,
the random generator and the one safe way to read a user's file.  Imports nothing else of tracecomp."""
