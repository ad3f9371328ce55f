"""What every step of the in-namespace launcher (:mod:`codex_lab.sandbox._launch`) shares: the C
library its system calls go through, and :class:`SetupError`, which names the step that failed.

Loaded by the launcher script without codex_lab (standard library only, relative imports only).
"""

import ctypes

_libc = ctypes.CDLL(None, use_errno=True)


class SetupError(OSError):
    """The sandbox could not be built; the message names the step and the path."""
