"""Utilities around models: `tc.utils.data` (datasets and a DataLoader)."""
from . import data

__all__ = ["data"]
