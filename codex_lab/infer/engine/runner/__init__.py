"""The engine's model runner: the forwards of one engine step, one module per kind of step
(:mod:`.eager`, :mod:`.compiled`, :mod:`.mixed`, and the compiled step's :mod:`.options`)."""
