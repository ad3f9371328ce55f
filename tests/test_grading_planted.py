"""The checker loads no code from a place the graded process can write (course/checker.py,
``isolate``).

The red team's route: the submission's process runs as the checker's uid, so it computed
``codex_lab.nn.native_build.so_path(...)`` for the sparse-attention and MoE kernels and wrote
its own library there (with a matching ``.sha256``, in a 0700 folder: owner, mode and digest
checks cannot tell the same uid's files apart); when a check then trained the learner's design
in the checker, the checker loaded that library and its constructor forged every result.
Inductor's compiled-graph cache, matplotlib's rc file and Python's user site were the same
class of route.

Here a submission plants all of them (a real shared library whose constructor prints a marker
and ends the process with exit code 77, a library and a module in Inductor's cache folders,
a ``matplotlibrc`` naming a planted backend module, modules and a ``.pth`` in the user site)
at every place the checker used to look and at every place its environment names now, and is
graded with a hidden check that runs *in the checker* what a check training a design runs (a
model with a MoBA layer and an MoE layer, forward, backward and eval; ``torch.compile``;
matplotlib) and then probes the process. The planted code never runs, the wrong answers score
0 and the probe passes; the probe also starts a process inside the same sandbox with the one
native switch undone, which loads the planted library (exit 77): the plant is real and the
switch is what blocks it. The unit-level counterfactual shows the same in a plain process.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import shlex
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from codex_lab.sandbox import isolation_mode

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "codex_lab"
MODE = isolation_mode()
MARK = "CODEX_PLANTED_CONSTRUCTOR_RAN"
NOBODY = 65534

needs_cc = pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("cc") is None,
                              reason="no C compiler (gcc or cc) on PATH to build the planted library")
needs_namespaces = pytest.mark.skipif(MODE not in ("root", "userns"),
                                      reason="the checker and the submission share a boundary only in the namespace sandbox")

# the planted library: its constructor runs at load, says so on stderr, touches a marker file where one is
# named, and ends the process (exit 77): a checker that loaded it would end mid-exercise, visibly
PLANTED_C = r"""
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

__attribute__((constructor)) static void planted(void) {
    const char *msg = "CODEX_PLANTED_CONSTRUCTOR_RAN\n";
    (void)!write(2, msg, strlen(msg));
    const char *marker = getenv("CODEX_PLANT_MARKER");
    if (marker) {
        int fd = open(marker, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            (void)!write(fd, "ran\n", 4);
            close(fd);
        }
    }
    _exit(77);
}

/* the symbols the real kernels export */
int sparse_fwd(void) { return 0; }
int sparse_bwd(void) { return 0; }
int moe_swiglu(void) { return 0; }
"""


@pytest.fixture(scope="module")
def planted_so(tmp_path_factory) -> bytes:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler (gcc or cc) on PATH to build the planted library")
    d = tmp_path_factory.mktemp("planted")
    (d / "planted.c").write_text(PLANTED_C)
    r = subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(d / "planted.so"), str(d / "planted.c")],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        pytest.skip(f"could not build the planted library: {r.stderr[-300:]}")
    return (d / "planted.so").read_bytes()


# The submission: wrong answers to lesson 00's exercises, each planting first. Only imports,
# functions and classes of a submission are loaded, so every constant lives in a function.
SUBMISSION = r'''
import base64, hashlib, json, os, sys, tempfile


def _blob():
    return "__BLOB__"


def _module():  # a module that, imported anywhere, says so and ends the process
    return b"import os\nos.write(2, b'CODEX_PLANTED_MODULE_RAN\\n')\nos._exit(79)\n"


def _write(path, data):
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        return True
    except OSError:
        return False


def _homes():
    # the run's folder (the checker's HOME and working folder before the fix), this process's own
    # folder, and whatever HOME the checker handed down now
    run = os.path.dirname(os.getcwd())
    return sorted({run, os.getcwd(), os.path.expanduser("~"), os.environ.get("HOME") or run})


def _plant_native():
    from codex_lab.nn import native_build as nb
    from codex_lab.nn.moe_native import FLAGS

    blob = base64.b64decode(_blob())
    side = json.dumps({"sha256": hashlib.sha256(blob).hexdigest(), "size": len(blob)}).encode()
    folders = [os.path.join(h, ".cache", "codex_lab", "native") for h in _homes()]
    for var in ("XDG_CACHE_HOME",):
        if os.environ.get(var):
            folders.append(os.path.join(os.environ[var], "codex_lab", "native"))
    if os.environ.get("CODEX_LAB_NATIVE_DIR"):
        folders.append(os.environ["CODEX_LAB_NATIVE_DIR"])
    saved = os.environ.get("CODEX_LAB_NATIVE_DIR")
    try:
        for folder in folders:
            os.environ["CODEX_LAB_NATIVE_DIR"] = folder
            for name, flags in (("sparse_attention", ()), ("moe_swiglu", tuple(FLAGS))):
                so = str(nb.so_path(name, flags))
                if _write(so, blob):
                    _write(so + nb.DIGEST_SUFFIX, side)
    finally:
        if saved is None:
            os.environ.pop("CODEX_LAB_NATIVE_DIR", None)
        else:
            os.environ["CODEX_LAB_NATIVE_DIR"] = saved


def _plant_inductor():
    blob = base64.b64decode(_blob())
    roots = [os.environ.get("TORCHINDUCTOR_CACHE_DIR", "")]
    for base in set(_homes()) | {tempfile.gettempdir(), "/tmp"}:
        try:
            roots += [os.path.join(base, n) for n in os.listdir(base) if n.startswith("torchinductor_")]
        except OSError:
            pass
    for r in roots:
        if r:
            _write(os.path.join(r, "fxgraph", "planted", "planted.so"), blob)
            _write(os.path.join(r, "planted", "cplanted.py"), _module())
            _write(os.path.join(r, "dynamo", "planted.py"), _module())


def _plant_config():
    rc = b"backend: module://codex_planted_backend\nfigure.dpi: 12.5\n"
    rcs = [os.path.join(h, "matplotlibrc") for h in _homes()]
    rcs += [os.path.join(h, ".config", "matplotlib", "matplotlibrc") for h in _homes()]
    if os.environ.get("MPLCONFIGDIR"):
        rcs.append(os.path.join(os.environ["MPLCONFIGDIR"], "matplotlibrc"))
    if os.environ.get("XDG_CONFIG_HOME"):
        rcs.append(os.path.join(os.environ["XDG_CONFIG_HOME"], "matplotlib", "matplotlibrc"))
    for p in rcs:
        _write(p, rc)
    pyver = "python%d.%d" % sys.version_info[:2]
    for h in _homes():
        user_site = os.path.join(h, ".local", "lib", pyver, "site-packages")
        for d in (h, user_site):
            _write(os.path.join(d, "codex_planted_backend.py"), _module())
            _write(os.path.join(d, "codex_planted_usersite.py"), _module())
        _write(os.path.join(user_site, "usercustomize.py"), _module())
        _write(os.path.join(user_site, "codex_planted.pth"), b"import codex_planted_usersite\n")


def _plant():
    for step in (_plant_native, _plant_inductor, _plant_config):
        try:
            step()
        except Exception:
            pass


def chars_per_token(tokenizer, texts):
    _plant()
    return 0.123


def cut_at_function_end(completion):
    _plant()
    return completion + "\n# not cut"
'''

# The hidden check: runs in the checker, after the submission planted (it calls the submission first).
PROBE = r'''
import json, os, subprocess, sys

from codex_lab.course.checks import exercise

MARK = "CODEX_PLANTED_CONSTRUCTOR_RAN"


class Tok:
    def encode(self, s):
        return list(s)


def _native_paths():
    """Where load_native would look with the native switches alone undone."""
    from codex_lab.nn import native_build as nb
    from codex_lab.nn.moe_native import FLAGS

    saved = os.environ.pop("CODEX_LAB_NATIVE_DIR", None)
    try:
        return [nb.so_path("sparse_attention"), nb.so_path("moe_swiglu", tuple(FLAGS))]
    finally:
        if saved is not None:
            os.environ["CODEX_LAB_NATIVE_DIR"] = saved


def _files(folder):
    out = []
    for base, _, names in os.walk(folder):
        out += [os.path.join(base, n) for n in names]
    return sorted(out)


def _problems():
    import torch

    from codex_lab.nn import native_build as nb

    out = []
    # 0. the plant is there and passes load_native's own checks (owner, mode, digest): else this proves nothing
    for so in _native_paths():
        fd, why = nb._open_verified(so)
        if fd is None:
            out.append(f"no verified plant at {so}: {why}")
        else:
            os.close(fd)
    # 1. native kernels off, whatever is planted
    from codex_lab.nn.moba_fast import moba_native_status
    from codex_lab.nn.moe_native import moe_native_status
    from codex_lab.nn.sparse_native import native_status

    for f in (native_status, moe_native_status, moba_native_status):
        if f() != "CODEX_LAB_NATIVE=0":
            out.append(f"{f.__name__}() = {f()!r}")
    # the route itself: train and evaluate a design with a MoBA layer and an MoE layer here, in the checker
    from codex_lab.nn.config import ModelConfig
    from codex_lab.nn.model import CodexModel

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=64, d_model=32, n_layer=2, n_head=2, max_seq_len=128, attn_patterns=["dense", "moba:16:2"],
                      attn_impl="blocks", moe_layers=[1], n_experts=4, moe_top_k=2)
    model = CodexModel(cfg)
    ids = torch.randint(0, 64, (2, 96))
    res = model(ids, ids)
    (res.loss + res.aux_loss).backward()
    model.eval()
    with torch.no_grad():
        fast = model(ids).logits
    for m in model.modules():  # the same weights through the reference kernels: the torch paths agree
        if isinstance(getattr(m, "impl", None), str):
            m.impl = "reference"
        if hasattr(m, "native"):
            m.native = False
    with torch.no_grad():
        ref = model(ids).logits
    if not torch.allclose(fast, ref, atol=1e-4, rtol=1e-4):
        out.append(f"the kernels' torch paths differ from the reference by {(fast - ref).abs().max().item():.3g}")
    # 2. torch.compile off; Inductor's folder untouched
    import torch._dynamo.config as dynamo_config

    if not dynamo_config.disable or os.environ.get("TORCHDYNAMO_DISABLE") != "1":
        out.append("torch.compile is on")
    inductor = os.environ.get("TORCHINDUCTOR_CACHE_DIR", "")
    before = _files(inductor)
    f = torch.compile(lambda x: torch.sin(x) * 2 + 1)
    x = torch.randn(8)
    if not torch.equal(f(x), torch.sin(x) * 2 + 1):
        out.append("torch.compile changed a result")
    if _files(inductor) != before:
        out.append("something was compiled into Inductor's folder")
    # 3. matplotlib: the installed rc file, the Agg backend, no planted module
    import matplotlib

    if matplotlib.rcParams["figure.dpi"] == 12.5:
        out.append(f"a planted matplotlibrc was read: {matplotlib.matplotlib_fname()}")
    import matplotlib.pyplot as plt

    plt.figure()
    plt.close("all")
    if matplotlib.get_backend().lower() != "agg":
        out.append(f"matplotlib backend {matplotlib.get_backend()}")
    # 4. the import path: no user site, no writable root, no planted module
    if not sys.flags.no_user_site:
        out.append("the user site is on")
    for p in sys.path:
        if not p or os.access(p, os.W_OK):
            out.append(f"import root {p!r} is writable")
    for name in ("codex_planted_backend", "codex_planted_usersite", "usercustomize"):
        if name in sys.modules:
            out.append(f"{name} was imported")
    # 5. every file this process maps as code is one it cannot write
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split(None, 5)
            if len(parts) == 6 and "x" in parts[1] and parts[5].startswith("/"):
                path = parts[5].strip()
                if path.endswith("(deleted)") or os.access(path, os.W_OK):
                    out.append(f"code mapped from a writable file: {path}")
    # 6. the counterfactual, in this sandbox: a process with the native switches alone undone loads the plant
    env = {k: v for k, v in os.environ.items() if k not in ("CODEX_LAB_NATIVE", "CODEX_LAB_NATIVE_DIR")}
    code = ("import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
            "from codex_lab.nn.native_build import load_native; print(load_native('sparse_attention'))")
    r = subprocess.run([sys.executable, "-I", "-c", code, json.dumps(sys.path)], env=env, capture_output=True, text=True,
                       timeout=300)
    if r.returncode != 77 or MARK not in r.stderr:
        out.append(f"counterfactual: without the switch the plant did not load (exit {r.returncode}: "
                   f"{(r.stdout + r.stderr)[-300:]})")
    return out


@exercise("00", "chars_per_token", points=1)
def probe(fn):
    try:
        fn(Tok(), ["abc"])  # the submission plants here too (its answer is the public check's business)
    except Exception:
        pass
    problems = _problems()
    assert not problems, "; ".join(problems)[:1800]
'''

FORGED = ("CODEX_PLANTED", "exit code 77", "exit code 78", "exit code 79")


def _write_case(base: Path, blob: bytes) -> tuple[Path, Path]:
    sub_dir, hidden = base / "sub", base / "hidden"
    sub_dir.mkdir(parents=True)
    hidden.mkdir()
    sub = sub_dir / "00_tour.py"
    sub.write_text(SUBMISSION.replace("__BLOB__", base64.b64encode(blob).decode()))
    (hidden / "probe00.py").write_text(PROBE)
    return sub, hidden


def _judge(rows: list[dict]) -> None:
    by = {(r["name"], r["visibility"]): r for r in rows}
    for r in rows:
        assert not any(m in r["message"] for m in FORGED), r  # no planted code ran in the checker
    for name in ("chars_per_token", "cut_at_function_end"):  # the honest checks' score for wrong answers
        r = by[(name, "public")]
        assert (r["status"], r["points"]) == ("failed", 0), r
    probe = by[("chars_per_token", "hidden")]
    assert (probe["status"], probe["points"]) == ("passed", 1), probe["message"]


@needs_cc
@needs_namespaces
def test_planted_library_inductor_cache_and_matplotlibrc_never_run_in_the_checker(tmp_path, planted_so):
    from dataclasses import asdict

    from codex_lab.course.grading import grade_file

    sub, hidden = _write_case(tmp_path, planted_so)
    rows = [asdict(r) for r in grade_file(sub, hidden=hidden, timeout_s=120)]
    _judge(rows)


NORMAL_USER = """
import json, sys
from dataclasses import asdict
from codex_lab.sandbox import isolation_mode
print("MODE", isolation_mode(), flush=True)
if isolation_mode() == "userns":
    from codex_lab.course.grading import grade_file
    rows = [asdict(r) for r in grade_file({sub!r}, hidden={hidden!r}, timeout_s=120)]
    print("ROWS", json.dumps(rows))
"""


def _blocked_ancestor(path: str) -> str | None:
    """The outermost folder on ``path`` that other users cannot pass through (None: all can)."""
    p, found = os.path.realpath(path), None
    while p != "/":
        if not os.stat(p).st_mode & 0o001:
            found = p
        p = os.path.dirname(p)
    return found


@needs_cc
@pytest.mark.skipif(os.geteuid() != 0 or MODE == "plain" or not all(shutil.which(t) for t in ("unshare", "setpriv", "mount")),
                    reason="needs root (to build the normal user's home) and unshare/setpriv/mount")
def test_as_a_normal_user_the_planted_code_never_runs_in_the_checker(planted_so):
    """The same submission graded by a normal user (uid 65534, userns mode, where both processes are
    uid 0 of the sandbox's user namespace), started as tests/test_sandbox_escapes.py starts one; the
    interpreter is made reachable at its own path (a private mount namespace: an empty folder over the
    first folder on the way that other users cannot enter, the interpreter bound back into it), so the
    environment's own python runs and the grader sees the usual layout."""
    from test_sandbox_layouts import _others_can_reach

    env_site = next(p for p in sys.path if p.endswith("site-packages"))
    if not _others_can_reach(env_site) or not _others_can_reach(str(PKG)):
        pytest.skip(f"the environment {env_site} or the package sits in a folder other users cannot enter")
    base_prefix = os.path.realpath(sys.base_prefix)
    blocked = _blocked_ancestor(base_prefix)
    if blocked is not None and (blocked == "/" or _inside_any(env_site, blocked) or _inside_any(str(PKG), blocked)):
        pytest.skip(f"the interpreter's folder {blocked} also holds the environment or the package")
    base = Path(tempfile.mkdtemp(prefix="codex-lab-planted-"))
    os.chmod(base, 0o755)
    home = base / "home"
    try:
        sub, hidden = _write_case(home / "case", planted_so)
        probe = NORMAL_USER.format(sub=str(sub), hidden=str(hidden))
        q = shlex.quote
        reach = [] if blocked is None else [
            f"mkdir -p {base}/py", f"mount --bind {q(base_prefix)} {base}/py",
            f"mount -t tmpfs -o mode=0755 tmpfs {q(blocked)}", f"mkdir -p {q(base_prefix)}",
            f"mount --bind {base}/py {q(base_prefix)}"]
        script = "\n".join([
            "set -e", *reach, f"chown -R {NOBODY}:{NOBODY} {home}", f"chmod 0700 {home}", f"cd {home}",
            f"setpriv --reuid {NOBODY} --regid {NOBODY} --clear-groups --inh-caps=-all --bounding-set=-all "
            # no cgroup for this user here: the polled memory budget accepted (what this test checks is code loading)
            f"env -i PATH=/usr/bin:/bin HOME={home} CODEX_LAB_SANDBOX_MEMORY=polled CODEX_LAB_FAST=1 "
            f"CODEX_LAB_MODE=fast OMP_NUM_THREADS=1 {q(sys.executable)} -c {q(probe)}",
        ])
        r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                           capture_output=True, text=True, timeout=1200)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    out = r.stdout[-3000:] + r.stderr[-3000:]
    if "MODE userns" not in r.stdout:
        if "MODE plain" in r.stdout:
            pytest.skip("unprivileged user namespaces are not available: a normal user gets plain mode here")
        raise AssertionError(out)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("ROWS ")), None)
    assert line is not None, out
    _judge(json.loads(line[len("ROWS "):]))


def _inside_any(path: str, folder: str) -> bool:
    real = os.path.realpath(path)
    return real == folder or real.startswith(folder.rstrip("/") + "/")


# ---- the counterfactual, unit level: a plain process ------------------------------------------

PLAIN = textwrap.dedent("""
    import base64, hashlib, json, os, sys
    run = sys.argv[1]
    mode = sys.argv[2]
    blob = base64.b64decode(open(sys.argv[3]).read())
    if mode == "isolated":  # what the checker does first, then the submission plants where the checker now looks
        from codex_lab.course.checker import isolate
        isolate(run)
    from codex_lab.nn import native_build as nb
    saved = os.environ.pop("CODEX_LAB_NATIVE_DIR", None)
    so = nb.so_path("sparse_attention")  # the path load_native uses without CODEX_LAB_NATIVE_DIR
    if saved is not None:
        os.environ["CODEX_LAB_NATIVE_DIR"] = saved
    os.makedirs(so.parent, mode=0o700, exist_ok=True)
    so.write_bytes(blob)
    so.with_name(so.name + nb.DIGEST_SUFFIX).write_text(
        json.dumps({"sha256": hashlib.sha256(blob).hexdigest(), "size": len(blob)}))
    print("PLANTED", so, flush=True)
    lib, why = nb.load_native("sparse_attention")
    print("LOADED" if lib is not None else "NOT LOADED", why, flush=True)
""")


def _plain(tmp_path: Path, blob: bytes, mode: str, native: str | None) -> tuple[subprocess.CompletedProcess, Path]:
    run = tmp_path / mode
    (run / "home").mkdir(parents=True)
    marker = tmp_path / f"{mode}.marker"
    (tmp_path / "blob.b64").write_text(base64.b64encode(blob).decode())
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(run / "home"), "TMPDIR": str(run),
           "CODEX_PLANT_MARKER": str(marker), "OMP_NUM_THREADS": "1"}
    if native is not None:
        env["CODEX_LAB_NATIVE"] = native
    r = subprocess.run([sys.executable, "-c", PLAIN, str(run), mode, str(tmp_path / "blob.b64")], cwd=run, env=env,
                       capture_output=True, text=True, timeout=600)
    return r, marker


@needs_cc
def test_counterfactual_without_the_switch_load_native_runs_a_planted_library(tmp_path, planted_so):
    """In a plain process with CODEX_LAB_NATIVE unset, a library planted at so_path with a matching digest
    passes every check of load_native and is loaded: its constructor runs (marker file, exit 77)."""
    r, marker = _plain(tmp_path, planted_so, "plain", None)
    assert "PLANTED" in r.stdout, r.stdout + r.stderr
    assert r.returncode == 77 and MARK in r.stderr and marker.read_text() == "ran\n", (r.returncode, r.stdout, r.stderr)


@needs_cc
def test_the_native_switch_is_what_blocks_the_planted_library(tmp_path, planted_so):
    """The same plant, the same process, CODEX_LAB_NATIVE=0 alone changed: nothing is loaded."""
    r, marker = _plain(tmp_path, planted_so, "switched", "0")
    assert r.returncode == 0 and "PLANTED" in r.stdout and "NOT LOADED CODEX_LAB_NATIVE=0" in r.stdout, r.stdout + r.stderr
    assert MARK not in r.stderr and not marker.exists()


@needs_cc
def test_after_isolate_a_library_planted_where_the_checker_looks_is_never_loaded(tmp_path, planted_so):
    r, marker = _plain(tmp_path, planted_so, "isolated", None)
    assert r.returncode == 0 and "PLANTED" in r.stdout and "NOT LOADED CODEX_LAB_NATIVE=0" in r.stdout, r.stdout + r.stderr
    assert MARK not in r.stderr and not marker.exists()


# ---- isolate() itself ------------------------------------------------------------------------

ISOLATE = textwrap.dedent("""
    import json, os, stat, sys
    run = os.path.realpath(sys.argv[1])
    import torch, torch._dynamo.config  # imported first, as the sandbox's boot does (codex_lab's __init__ imports torch)
    sys.path.insert(0, run)
    sys.path.insert(0, "")
    from codex_lab.course.checker import UNCREATABLE, isolate
    env = isolate(run)
    fresh = {k: v for k, v in env.items() if k in ("HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "MPLCONFIGDIR",
                                                    "TORCHINDUCTOR_CACHE_DIR", "TORCH_HOME", "HF_HOME")}
    modes = {k: oct(stat.S_IMODE(os.stat(v).st_mode)) for k, v in fresh.items()}
    empty = {k: os.listdir(v) for k, v in fresh.items()}
    try:
        os.makedirs(os.environ["CODEX_LAB_NATIVE_DIR"])
        creatable = True
    except OSError:
        creatable = False
    f = torch.compile(lambda x: x * 2 + 1)
    same = bool(torch.equal(f(torch.ones(3)), torch.full((3,), 3.0)))
    from codex_lab.nn.native_build import load_native
    print(json.dumps({"env": env, "modes": modes, "empty": empty, "creatable": creatable, "same": same,
                      "dynamo_disable": torch._dynamo.config.disable, "path": sys.path, "native": load_native("moe_swiglu")[1],
                      "inductor_files": [n for _, _, ns in os.walk(env["TORCHINDUCTOR_CACHE_DIR"]) for n in ns],
                      "user_site": __import__("site").ENABLE_USER_SITE, "uncreatable": UNCREATABLE}))
""")


def test_isolate_turns_off_kernels_and_compile_and_moves_every_config_folder(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    r = subprocess.run([sys.executable, "-c", ISOLATE, str(run)], cwd=run, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "HOME": str(run), "TMPDIR": str(run)})
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    env = got["env"]
    assert env["CODEX_LAB_NATIVE"] == "0" and got["native"] == "CODEX_LAB_NATIVE=0"
    assert env["CODEX_LAB_NATIVE_DIR"].startswith(got["uncreatable"] + "/") and not got["creatable"]
    assert env["TORCHDYNAMO_DISABLE"] == "1" and got["dynamo_disable"] is True and got["same"]
    assert got["inductor_files"] == []  # nothing compiled
    assert env["MPLBACKEND"] == "Agg" and env.get("MATPLOTLIBRC", "").endswith("mpl-data/matplotlibrc")
    real_run = os.path.realpath(run)
    for var, mode in got["modes"].items():  # fresh, private, empty, made inside the run
        assert mode == "0o700" and got["empty"][var] == [] and env[var].startswith(real_run + "/"), (var, mode)
    assert got["user_site"] is False
    assert not any(p in ("", ".") or (os.path.isabs(p) and os.path.realpath(p).startswith(real_run))
                   for p in got["path"]), got["path"]


def test_the_checker_module_imports_nothing_but_the_standard_library():
    """checker.py can be loaded, and isolate() run, before torch or the package is imported."""
    code = ("import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('checker_alone', {str(PKG / 'course' / 'checker.py')!r})\n"
            "m = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(m)\n"
            "print(sorted(n for n in sys.modules if n.split('.')[0] in ('torch', 'codex_lab', 'numpy')))\n")
    r = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr
