"""What a sandboxed run gives back: :class:`SandboxResult`, or :class:`SandboxUnavailable` when
the sandbox cannot be built here (with the one-line fix every setup failure names)."""

from __future__ import annotations

from dataclasses import dataclass

_FIX = ("to run generated code anyway without isolation (not a boundary: only on a machine you do not "
        "mind losing), set CODEX_LAB_SANDBOX=plain; otherwise please report this layout")


class SandboxUnavailable(RuntimeError):
    """The sandbox could not be built on this machine; the message names the cause and the fix."""

    __module__ = "codex_lab.sandbox"  # its public home: tracebacks name it there, as before the split


@dataclass
class SandboxResult:
    """Outcome: ok (exit code 0 within time), exit code, captured output (capped), timed_out.

    ``truncated`` is True when the output passed ``max_output_bytes`` (the child was then
    killed); ``mode`` names the isolation that held (``root``, ``userns`` or ``plain``).
    """

    __module__ = "codex_lab.sandbox"

    ok: bool
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    truncated: bool = False
    mode: str = "plain"
