"""Running compiled code: the reference interpreter now; the JIT engine, .so export and caches later."""
