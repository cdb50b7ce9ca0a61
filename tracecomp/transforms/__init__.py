"""Transforms of user functions: tc.trace (its closures, pickling and pass pipeline) and tc.vmap."""
