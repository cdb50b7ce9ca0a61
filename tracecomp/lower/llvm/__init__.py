"""Loop IR -> LLVM IR for the host CPU: function emitter, scalars, parallel loops, loop hints."""
