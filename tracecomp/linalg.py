"""torch.linalg's names for ops of ops.yaml: `tc.linalg.vector_norm(x)` is `tc.linalg_vector_norm(x)`."""
from .dispatch.api import linalg_matrix_norm as matrix_norm, linalg_vector_norm as vector_norm  # noqa: F401
