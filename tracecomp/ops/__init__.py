"""The operator table: schema parsing, ops.yaml loading, formulas, shape and dtype rules."""
