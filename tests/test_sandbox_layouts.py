"""The sandbox starts for every ordinary install layout, as root and as a normal user.

The bug this guards: pyenv's Python and the virtual environment in two folders of one
private (0700) home made every sandboxed run fail at setup, so HumanEval scored 1/164,
grading could not run and the report crashed. Each test builds a layout for real, inside a
private mount namespace (so nothing on the machine changes): a private home owned by the
user who runs it, the machine's Python installation bind-mounted where pyenv or conda would
put it, a virtual environment made with ``python -m venv`` where the layout has one, and the
course's package in a clone beside it or installed in the environment. Then the layout's own
Python starts a sandbox that imports codex_lab and prints its prefix.

As a normal user (uid 65534, via ``setpriv``) the sandbox runs in ``userns`` mode; as root in
``root`` mode. Where ``unshare``/``setpriv`` or namespaces are missing, the tests skip and say why.
"""

from __future__ import annotations

import os
import shlex
import shutil
import site
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

import codex_lab

PKG = Path(codex_lab.__file__).resolve().parent
ENV_SITE = next((p for p in site.getsitepackages() if (Path(p) / "torch").exists() or (Path(p) / "numpy").exists()),
                site.getsitepackages()[0])
BASE = os.path.realpath(sys.base_prefix)
PYVER = f"python{sys.version_info.major}.{sys.version_info.minor}"
NOBODY = 65534

_missing = [t for t in ("unshare", "setpriv", "mount") if shutil.which(t) is None]
needs_tools = pytest.mark.skipif(
    os.geteuid() != 0 or sys.platform != "linux" or bool(_missing),
    reason=f"building layouts needs root on Linux with unshare, setpriv and mount (missing: {_missing or 'root'})")

# what the layout's Python runs: start a sandbox whose child imports codex_lab from that layout
PROBE = textwrap.dedent("""
    import sys
    {prelude}
    from codex_lab.sandbox import isolation_mode, run_python
    r = run_python("import codex_lab, sys, os; print('CHILD', os.path.dirname(codex_lab.__file__), sys.prefix)",
                   timeout_s=60, memory_mb=1024)
    print('MODE', isolation_mode(), 'OK', r.ok)
    print(r.stdout)
    print(r.stderr[-2000:], file=sys.stderr)
""")


def _layout_script(home: str, kind: str, as_user: bool) -> str:
    """Shell lines (run as root in a private mount namespace) that build ``kind`` in ``home``
    and run the probe with the layout's Python, as root or as the normal user."""
    uid = NOBODY if as_user else 0
    py_home = f"{home}/.pyenv/versions/{sys.version_info.major}.{sys.version_info.minor}"
    lines = [f"set -e", f"mkdir -p {home}", f"chmod 0700 {home}"]
    prelude = f"import site; site.addsitedir({ENV_SITE!r})"
    if kind in ("pyenv_venv_home", "venv_in_clone", "user_site"):
        lines += [f"mkdir -p {py_home}", f"mount --bind {shlex.quote(BASE)} {py_home}"]
        base_py = f"{py_home}/bin/{PYVER}"
    else:  # conda-like: the installation itself in the home, no venv
        lines += [f"mkdir -p {home}/miniconda3", f"mount --bind {shlex.quote(BASE)} {home}/miniconda3"]
        base_py = f"{home}/miniconda3/bin/{PYVER}"
    # the course cloned in the home (its package folder; bound, so nothing is copied)
    lines += [f"mkdir -p {home}/course/codex_lab", f"mount --bind {shlex.quote(str(PKG))} {home}/course/codex_lab"]
    clone_prelude = prelude + f"; sys.path.insert(0, {home + '/course'!r})"
    # as the normal user no cgroup may be had here: the polled memory budget accepted (layouts are the point)
    env = "env -i PATH=/usr/bin:/bin" + (" CODEX_LAB_SANDBOX_MEMORY=polled" if as_user else "")
    if kind == "pyenv_venv_home":
        venv = f"{home}/work/proj/.venv"
        lines += [f"{base_py} -m venv --without-pip {venv}"]
        py, pre = f"{venv}/bin/python", clone_prelude
    elif kind == "venv_in_clone":
        venv = f"{home}/course/.venv"
        lines += [f"{base_py} -m venv --without-pip {venv}",
                  f"echo {shlex.quote('import site; site.addsitedir(' + repr(ENV_SITE) + ')')} > "
                  f"{venv}/lib/{PYVER}/site-packages/course_env.pth"]
        py, pre = f"{venv}/bin/python", f"sys.path.insert(0, {home + '/course'!r})"
    elif kind == "user_site":
        user_site = f"{home}/.local/lib/{PYVER}/site-packages"
        lines += [f"mkdir -p {user_site}",
                  f"echo {shlex.quote('import site; site.addsitedir(' + repr(ENV_SITE) + ')')} > {user_site}/env.pth"]
        py, pre, env = base_py, f"sys.path.insert(0, {home + '/course'!r})", f"{env} HOME={home}"
    else:  # conda_home
        py, pre = base_py, clone_prelude
    if as_user:
        lines += [f"chown -R {uid}:{uid} {home}"]  # bind mounts keep their own owners
    probe = PROBE.format(prelude=pre)
    run = f"{env} {py} -c {shlex.quote(probe)}"
    if as_user:
        run = f"setpriv --reuid {uid} --regid {uid} --clear-groups --inh-caps=-all --bounding-set=-all {run}"
    lines += [f"cd {home}", run]
    return "\n".join(lines)


def _others_can_reach(path: str) -> bool:
    """Every folder on ``path`` lets other users pass (o+x): a normal user can import from it."""
    p = os.path.realpath(path)
    while True:
        if not os.stat(p).st_mode & 0o001:
            return False
        if p == "/":
            return True
        p = os.path.dirname(p)


@needs_tools
@pytest.mark.parametrize("as_user", [False, True], ids=["root", "normal_user"])
@pytest.mark.parametrize("kind", ["pyenv_venv_home", "conda_home", "venv_in_clone", "user_site"])
def test_the_sandbox_starts_in_layout(kind, as_user):
    if as_user and not _others_can_reach(ENV_SITE):
        pytest.skip(f"the environment {ENV_SITE} sits in a folder other users cannot enter: "
                    "the normal user of this test could not import torch from it")
    # a folder every user can pass through (pytest's tmp_path sits in root's 0700 folder)
    base = Path(tempfile.mkdtemp(prefix="codex-lab-layout-"))
    os.chmod(base, 0o755)
    home = str(base / "home" / "u")
    script = _layout_script(home, kind, as_user)
    try:
        r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                           capture_output=True, text=True, timeout=240)
    finally:  # the binds lived in the namespace only: what is left are plain files of the layout
        shutil.rmtree(base, ignore_errors=True)
    out = r.stdout + "\n" + r.stderr
    if as_user and "MODE plain" in r.stdout:
        pytest.skip("unprivileged user namespaces are not available here: the normal user gets plain mode")
    assert r.returncode == 0, out
    assert f"MODE {'userns' if as_user else 'root'} OK True" in r.stdout, out
    child = next(ln for ln in r.stdout.splitlines() if ln.startswith("CHILD "))
    _, pkg_dir, prefix = child.split(" ")
    assert pkg_dir.startswith(home), out  # the layout's own package, not the machine's
    assert prefix.startswith(home), out  # the layout's own interpreter / environment
