"""Compiling while serving: a warm-up in a daemon thread of its own, the interpreter lock handed
back quickly while it runs, and a signal when it is done (or gave up).

The serving engine's compiled step (:class:`~codex_lab.infer.engine.runner.compiled.CompiledPagedStep`)
runs every step eagerly until this finishes, then switches to the graphs at once, so a server
answers within seconds of loading its model.
"""

from __future__ import annotations

import sys
import threading
from typing import Callable

from codex_lab.infer.engine.runner.options import freeze_long_lived

# the interpreter's thread switch interval while buckets compile in the background (seconds)
COMPILE_SWITCH_INTERVAL_S = 0.0002


def compile_in_background(warmup: Callable[[], dict[int, float]], ready: threading.Event, *,
                          on_error: Callable[[Exception], None],
                          on_done: Callable[[dict[int, float]], None] | None = None,
                          freeze_gc: bool = True) -> threading.Thread:
    """Run ``warmup`` (returns seconds per bucket) in a daemon thread named ``codex-lab-compile``;
    ``on_error`` gets what it raised (the server stays up, eager); ``ready`` is set when it ends
    either way, after :func:`freeze_long_lived` (``freeze_gc``: what the compiler left behind is
    never scanned again); then ``on_done`` gets the seconds per bucket ({} after an error)."""

    def work() -> None:
        per: dict[int, float] = {}
        # the compiler is pure Python for long stretches; a serving thread that let go of the
        # interpreter lock (every torch op does) waits for the compiler's switch interval to
        # get it back: 5 ms by default, per op, so one eager step of ~300 ops could take
        # seconds (completions of 16 tokens took up to 8.5 s during a warm-cache compile,
        # 2026-12-02). A short interval while compiling hands the lock back within 0.2 ms.
        switch = sys.getswitchinterval()
        sys.setswitchinterval(min(switch, COMPILE_SWITCH_INTERVAL_S))
        try:
            per = warmup()
        except Exception as exc:  # noqa: BLE001 - never take the server down: stay eager
            on_error(exc)
        finally:
            sys.setswitchinterval(switch)
            if freeze_gc:
                freeze_long_lived()
            ready.set()
        if on_done is not None:
            on_done(per)

    t = threading.Thread(target=work, name="codex-lab-compile", daemon=True)
    t.start()
    return t


__all__ = ["COMPILE_SWITCH_INTERVAL_S", "compile_in_background"]
