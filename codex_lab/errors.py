"""The one error type for bad input from a user: a file, a folder, a flag.

Raise :class:`InputError` with a message that names the problem and the fix (and the file,
when there is one). ``codex-lab`` prints it on one line and exits with status 2, instead
of a traceback.
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad user input (file, folder, flag); the message names the problem and the fix."""


class MissingFileError(InputError, FileNotFoundError):
    """A file or folder the user named does not exist (both an InputError and a FileNotFoundError)."""
