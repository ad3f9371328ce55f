"""The learner's view of the package: a copy of ``codex_lab`` in which the functions that
exercises ask for are absent.

Every package function or method named in the ``forbid=`` list of the exercises being graded
is, in the copy, a stub whose body is one line, ``raise NotImplementedError("write this one
yourself: ...")`` (signature, decorators, docstring and line numbers kept; the rest of its
module unchanged), and no lesson's ``checks.py`` is there. The grader's sandbox shows the
submission's process this copy *instead of* the real package (the real files are not
mounted), so no route inside that process -- a reload, a fresh copy loaded from the
module's file, ``os.open(..., dir_fd=...)``, an edited copy of the source, ``gc`` or the
stack -- finds the answer: it is not on its disk and not in its memory.

The checker, in the same sandbox, needs the real functions (its oracles): the real source
of each module the copy changed travels as a file, is read into the checker's memory and
deleted before the submission's process starts (:func:`install_real`), then served to the
checker's imports by an in-memory finder. The checker is non-dumpable, so a process of the
same uid cannot read that memory.

Copies are built once per package content and set of names, in the user's cache folder
(``$XDG_CACHE_HOME/codex-lab/learner-view``, private to the user; each copy world-readable
so the sandbox's unprivileged uid can read it), atomically (built beside, then renamed).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Iterable

PKG = Path(__file__).resolve().parents[1]  # codex_lab/
REAL_DIR = "real"  # the checker's copies of the real modules (sandbox folder, deleted once read)
_LOCK = threading.Lock()
_DIGEST: dict[tuple[Any, ...], str] = {}


def stub_message(dotted: str) -> str:
    """The text a stub raises (the grader reports it as a forbidden call)."""
    return (f"write this one yourself: {dotted} is the package's answer to this exercise, "
            "not your code (absent from the package your submission runs against)")


def package_names(names: Iterable[str]) -> list[str]:
    """The names among ``names`` that are this package's (the rest are library built-ins)."""
    return sorted({n for n in names if n.startswith("codex_lab.")})


def locate(dotted: str) -> tuple[str, str]:
    """(module, qualname) of the definition behind ``dotted`` (re-exports, properties,
    static/class methods and decorators looked through)."""
    import inspect

    from codex_lab.course.forbid import resolve

    owner, attr, obj = resolve(dotted)
    raw = inspect.getattr_static(owner, attr) if isinstance(owner, type) else obj
    if isinstance(raw, property):
        raw = raw.fget
    raw = getattr(raw, "__func__", raw)
    try:
        raw = inspect.unwrap(raw)
    except ValueError:
        pass
    mod, qual = getattr(raw, "__module__", None), getattr(raw, "__qualname__", None)
    if not mod or not qual or not (mod == "codex_lab" or mod.startswith("codex_lab.")) or "<locals>" in qual:
        raise ValueError(f"forbid: {dotted!r} is not a function or class defined at a module's top level in codex_lab")
    return mod, qual


def targets_of(names: Iterable[str]) -> dict[str, dict[str, str]]:
    """module -> {qualname: dotted name of the definition} for the package names in ``names``."""
    out: dict[str, dict[str, str]] = {}
    for n in package_names(names):
        mod, qual = locate(n)
        out.setdefault(mod, {})[qual] = f"{mod}.{qual}"
    return out


def _module_file(mod: str) -> Path:
    import importlib

    f = getattr(importlib.import_module(mod), "__file__", None)
    if not f:
        raise ValueError(f"forbid: module {mod} has no source file")
    return Path(f).resolve()


def stub_source(source: str, targets: dict[str, str], filename: str = "<module>") -> str:
    """``source`` with the body of every definition named in ``targets`` (qualname -> dotted)
    replaced by ``raise NotImplementedError(...)``; a class named there has all its methods
    stubbed. Line numbers are kept. Raises ValueError when a name is not found."""
    import ast

    from codex_lab.course.parsing import parse

    tree = parse(source, filename=filename)  # under the process-wide AST lock: grade_folder's threads
    spans: list[tuple[int, int, int, int, str]] = []  # (line, col, end line, end col, dotted): 1-based lines, byte cols
    found: set[str] = set()

    def stub(node: ast.FunctionDef | ast.AsyncFunctionDef, dotted: str) -> None:
        body = node.body
        first = body[1] if (len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                            and isinstance(body[0].value.value, str)) else body[0]
        spans.append((first.lineno, first.col_offset, node.end_lineno or first.lineno, node.end_col_offset or 0, dotted))

    def walk(stmts: list[ast.stmt], prefix: str, whole: str | None) -> None:
        for node in stmts:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                qual = prefix + node.name
                dotted = targets.get(qual) or (f"{whole}.{node.name}" if whole else None)
                if dotted:
                    found.add(qual if qual in targets else prefix[:-1])
                    stub(node, dotted)
            elif isinstance(node, ast.ClassDef):
                qual = prefix + node.name
                walk(node.body, qual + ".", targets.get(qual) or (f"{whole}.{node.name}" if whole else None))
            elif isinstance(node, (ast.If, ast.Try, ast.With)):  # definitions under `if`, `try`, `with`: same qualname
                for part in ("body", "orelse", "finalbody"):
                    walk(getattr(node, part, []) or [], prefix, whole)
                for h in getattr(node, "handlers", []) or []:
                    walk(h.body, prefix, whole)

    walk(tree.body, "", None)
    missing = sorted(set(targets) - found)
    if missing:
        raise ValueError(f"forbid: {', '.join(missing)} not found as a definition in {filename}")
    lines = source.encode("utf-8").splitlines(keepends=True)
    for line, col, end_line, end_col, dotted in sorted(spans, reverse=True):
        head, tail = lines[line - 1][:col], lines[end_line - 1][end_col:]
        text = f"raise NotImplementedError({stub_message(dotted)!r})".encode()
        lines[line - 1: end_line] = [head + text + b"\n" * (end_line - line) + tail]
    out = b"".join(lines).decode("utf-8")
    compile(out, filename, "exec")  # the stubbed module must still be valid Python
    return out


def _package_digest() -> str:
    """Hash of every file of the package (``__pycache__`` left out); memoised on the files' stats."""
    files = sorted(p for p in PKG.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    sig = tuple((str(p), st.st_size, st.st_mtime_ns) for p in files for st in [p.stat()])
    with _LOCK:
        if sig in _DIGEST:
            return _DIGEST[sig]
    h = hashlib.sha256()
    for p in files:
        h.update(str(p.relative_to(PKG)).encode() + b"\0")
        h.update(hashlib.sha256(p.read_bytes()).digest())
    digest = h.hexdigest()
    with _LOCK:
        _DIGEST.clear()
        _DIGEST[sig] = digest
    return digest


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/codex-lab/learner-view`` (or ``~/.cache/...``): made 0700, and refused
    when it is a link or another user's folder."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    root = base / "codex-lab" / "learner-view"
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = os.lstat(root)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise PermissionError(f"{root} is not a folder of this user's own; remove it to let the grader rebuild it")
    if st.st_mode & 0o022:
        os.chmod(root, 0o700)
    return root


def _ignore(folder: str, names: list[str]) -> set[str]:
    drop = {n for n in names if n == "__pycache__" or n.endswith((".pyc", ".pyo"))}
    if Path(folder).parent.name == "lessons":  # every lesson's checks: the grader's, never the learner's
        drop |= {n for n in names if n == "checks.py"}
    return drop


def _copy(src: str, dst: str) -> None:
    if src.endswith(".py"):  # sources are copied (never linked: an edit in place must not reach a built view)
        shutil.copyfile(src, dst)
        return
    try:  # large data files (the tiny model) are linked where the file system allows
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def view_for(names: Iterable[str]) -> Path:
    """The folder holding the learner's view (``<folder>/codex_lab``) for ``names`` (see the
    module docstring); built on first use, then reused while the package is unchanged."""
    targets = targets_of(names)
    key = hashlib.sha256((_package_digest() + json.dumps(targets, sort_keys=True)).encode()).hexdigest()[:32]
    root = cache_root()
    holder = root / key
    if (holder / "codex_lab" / ".complete").is_file():
        return holder
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
    try:
        view = tmp / "codex_lab"
        shutil.copytree(PKG, view, ignore=_ignore, copy_function=_copy)
        for mod, quals in targets.items():
            real = _module_file(mod)
            dst = view / real.relative_to(PKG)
            dst.write_text(stub_source(real.read_text(encoding="utf-8"), quals, str(real)), encoding="utf-8")
        import compileall

        compileall.compile_dir(str(view), quiet=2, workers=1)
        (view / ".complete").write_text(json.dumps(targets, sort_keys=True, indent=1))
        for dirpath, dirnames, filenames in os.walk(tmp):  # readable by the sandbox's unprivileged uid
            os.chmod(dirpath, 0o755)
            for f in filenames:
                p = os.path.join(dirpath, f)
                if os.stat(p).st_nlink == 1:  # a linked data file keeps the real file's mode
                    os.chmod(p, 0o644)
        try:
            os.rename(tmp, holder)
        except OSError:  # another grader built it meanwhile
            if not (holder / "codex_lab" / ".complete").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return holder


def real_sources(names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """For the checker: module -> {"file": real path, "package": bool, "text": real source} of
    each module the learner's view changed."""
    out: dict[str, dict[str, Any]] = {}
    for mod in targets_of(names):
        real = _module_file(mod)
        out[mod] = {"file": str(real), "package": real.name == "__init__.py", "text": real.read_text(encoding="utf-8")}
    return out


def real_files(names: Iterable[str]) -> dict[str, str | bytes]:
    """:func:`real_sources` as the sandbox's files (``real/<module>.py`` and a manifest)."""
    src = real_sources(names)
    files: dict[str, str | bytes] = {f"{REAL_DIR}/{mod}.py": v["text"] for mod, v in src.items()}
    files[f"{REAL_DIR}/manifest.json"] = json.dumps({mod: {"file": v["file"], "package": v["package"]}
                                                     for mod, v in src.items()})
    return files


class _MemoryFinder:
    """Serves the real modules (source held in memory) to the checker's imports."""

    def __init__(self, modules: dict[str, dict[str, Any]]) -> None:
        self.modules = modules

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        entry = self.modules.get(name)
        if entry is None:
            return None
        import importlib.util

        spec = importlib.util.spec_from_loader(name, self, origin=entry["file"], is_package=entry["package"])
        if spec is not None and entry["package"]:
            parent = sys.modules.get(name.rpartition(".")[0])
            # the package's folder in the learner's view, for its other submodules
            spec.submodule_search_locations = [os.path.join(p, name.rpartition(".")[2])
                                               for p in getattr(parent, "__path__", [])]
        return spec

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: Any) -> None:
        entry = self.modules[module.__spec__.name]
        module.__file__ = entry["file"]
        exec(compile(entry["text"], entry["file"], "exec"), module.__dict__)


def install_real(folder: str = REAL_DIR) -> None:
    """Checker side: read the real modules' sources from ``folder`` into memory, delete the
    folder, and serve them to this process's imports ahead of the learner's view."""
    base = Path(folder)
    if not base.is_dir():
        return
    manifest = json.loads((base / "manifest.json").read_text(encoding="utf-8"))
    modules = {mod: {**meta, "text": (base / f"{mod}.py").read_text(encoding="utf-8")} for mod, meta in manifest.items()}
    shutil.rmtree(base)
    for mod in modules:
        if mod in sys.modules:
            raise RuntimeError(f"{mod} was imported from the learner's view before the real modules were installed")
    sys.meta_path.insert(0, _MemoryFinder(modules))
