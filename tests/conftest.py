"""Test-wide settings: verify the graph after every compiler pass, not just the last."""
import os

os.environ.setdefault("TRACECOMP_VERIFY", "1")
