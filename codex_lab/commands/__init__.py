"""Sub-commands of the ``codex-lab`` CLI, one module per command (found automatically).

Each module defines ``NAME: str``, ``HELP: str``, ``add_arguments(parser)`` and
``main(args) -> int`` (the exit code).
"""
