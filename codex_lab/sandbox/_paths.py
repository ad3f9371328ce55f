"""What of the host the child sees: the import paths it needs beyond its own defaults, and the
paths (interpreter, environment, package) bound read-only into the namespace modes' root."""

from __future__ import annotations

import os
import sys
from pathlib import Path

# the codex_lab package folder: exposed alone, never the checkout around it
_PKG = Path(__file__).resolve().parent.parent


def _site_paths() -> list[str]:
    """Import paths the child needs beyond its own defaults: the environment's site folders
    (and what their .pth files add), the user site of a user-site install, the folder that
    holds the codex_lab package. Arbitrary other sys.path entries (a test folder, a checkout
    put there by hand) are left out."""
    import site

    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
    user = getattr(site, "USER_BASE", None)
    if user:
        prefixes.add(os.path.realpath(user))
    out = []
    for p in sys.path:
        if not p or not os.path.isdir(p):
            continue
        rp = os.path.realpath(p)
        if (os.path.basename(rp) in ("site-packages", "dist-packages")
                or any(rp == q or rp.startswith(q + "/") for q in prefixes)):
            out.append(p)
    holder = str(_PKG.parent)
    if holder not in out:
        out.append(holder)
    return out


def exposed_paths(package: str | None = None) -> list[str]:
    """Paths (unresolved, as the interpreter names them) bound read-only into the sandbox's root:
    the interpreter, its prefixes, the import paths of :func:`_site_paths` (the folder holding
    the package is replaced by the package folder itself) and the package. With ``package``
    (a folder holding another ``codex_lab``, see :func:`run_python`), that folder instead of
    the real package."""
    out = {sys.executable, os.path.realpath(sys.executable), sys.prefix, sys.base_prefix, sys.exec_prefix,
           sys.base_exec_prefix, package or str(_PKG)}
    holder = str(_PKG.parent)
    for p in _site_paths():
        if os.path.realpath(p) != os.path.realpath(holder):
            out.add(p)
    return sorted(p for p in out if p and os.path.exists(p))
