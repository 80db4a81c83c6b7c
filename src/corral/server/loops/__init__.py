"""Background loops: each a ``tick()`` run by the one generic ``LoopRunner``."""
