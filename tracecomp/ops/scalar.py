"""The scalar primitives elementwise formulas are written in.

Every backend implements exactly these (NumPy for eager and the interpreter, LLVM IR
for the CPU, NVPTX for CUDA); everything else elementwise is a formula over them.
Python operators (+ - * / ** comparisons, `and`/`or`/`not` on bools) are primitives too.
"""
PRIMITIVES = {
    # unary math
    "exp", "exp2", "expm1", "log", "log2", "log1p", "sin", "cos", "tan", "tanh", "erf",
    "sqrt", "floor", "ceil", "round", "abs", "sign",
    # binary
    "maximum", "minimum", "atan2", "pow", "fmod",
    # widening (special functions compute in float64)
    "float64",
    # selection and logic
    "where", "logical_and", "logical_or", "logical_not", "logical_xor",
}
