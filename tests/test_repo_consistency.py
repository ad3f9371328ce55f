"""The repo's generated and duplicated artefacts agree with their sources."""

import re
import tomllib
from pathlib import Path

import jupytext
import pytest

from codex_lab import links
from codex_lab.course.exercises import BEGIN, generate_exercises

ROOT = Path(__file__).resolve().parents[1]
NB_DIRS = ["notebooks", "solutions", "exercises"]


def _name(req: str) -> str:
    return re.split(r"[<>=!\[ ;@]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_environment_yml_declares_the_same_dependencies_as_pyproject():
    pp = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {_name(r) for r in pp["dependencies"]}
    for extra in pp["optional-dependencies"].values():
        wanted |= {_name(r) for r in extra if not r.startswith("codex_lab")}
    text = (ROOT / "environment.yml").read_text()
    deps = text[text.index("dependencies:"):]  # skip the channels list
    env_lines = [ln.strip()[2:] for ln in deps.splitlines() if ln.strip().startswith("- ")]
    declared = {_name(x) for x in env_lines if not x.startswith(("-", "python", "pip", "--"))}
    assert wanted == declared, f"only in pyproject: {wanted - declared}; only in environment.yml: {declared - wanted}"
    pins = {_name(x): x for x in env_lines}
    assert pins["torch"].startswith("torch=="), "environment.yml pins torch exactly (CPU build for Binder)"


def _notebook_pairs():
    for d in NB_DIRS:
        for py in sorted((ROOT / d).glob("*.py")):
            yield pytest.param(py, id=f"{d}/{py.name}")


@pytest.mark.parametrize("py", list(_notebook_pairs()))
def test_jupytext_pair_in_sync(py: Path):
    ipynb = py.with_suffix(".ipynb")
    assert ipynb.is_file(), f"{ipynb.name} is missing: run `jupytext --sync {py.relative_to(ROOT)}`"
    a = jupytext.read(py)
    b = jupytext.read(ipynb)
    cells = lambda nb: [(c.cell_type, c.source.strip()) for c in nb.cells]  # noqa: E731
    assert cells(a) == cells(b), f"{py.name} and {ipynb.name} differ: run `jupytext --sync {py.relative_to(ROOT)}`"
    assert not any(c.get("outputs") for c in b.cells), f"{ipynb.name} has outputs committed; clear them"


@pytest.mark.parametrize("py", [p for p in _notebook_pairs() if "exercises" not in p.id])
def test_notebook_header_has_runtime_colab_badge_and_install_cell(py: Path):
    text = py.read_text()
    first_md = jupytext.read(py).cells[0].source
    assert "Run time" in first_md and "CPU" in first_md and "GPU" in first_md, "first cell states CPU and GPU run time"
    rel = f"{py.parent.name}/{py.stem}.ipynb"
    if py.parent.name == "notebooks":
        assert links.colab_url(rel) in first_md, f"Colab badge for {rel} (links.colab_url) in the first cell"
    assert 'if "google.colab" in sys.modules' in text and links.pip_spec() in text, "Colab-only install cell"
    assert "--upgrade" not in text and "pip install torch" not in text, "never reinstall torch in Colab"


def test_exercises_generated_and_free_of_answers():
    assert generate_exercises(ROOT / "solutions", ROOT / "exercises", check=True) == [], (
        "exercises/ drifted from solutions/: run `codex-lab exercises generate`"
    )
    for p in (ROOT / "exercises").glob("*.py"):
        assert BEGIN not in p.read_text(), f"{p.name} leaks a solution"


def test_every_lesson_notebook_is_tested_by_nbval():
    # pytest collects notebooks/ and solutions/ (testpaths) with --nbval-lax (addopts)
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert {"notebooks", "solutions"} <= set(cfg["testpaths"]) and "--nbval-lax" in cfg["addopts"]


def test_readme_links_come_from_links_module():
    readme = (ROOT / "README.md").read_text()
    assert links.binder_url() in readme and links.colab_url("notebooks/00_tour.ipynb") in readme
    for cmd in ("codex-lab report", "pytest", "jupyter lab"):
        assert cmd in readme


def test_every_public_name_resolves():
    import codex_lab

    import importlib
    import pkgutil
    import types

    missing = [n for n in codex_lab.__all__ if getattr(codex_lab, n, None) is None]
    assert not missing, f"codex_lab.__all__ names that do not import: {missing}"
    for m in pkgutil.iter_modules(codex_lab.__path__):  # every submodule imported...
        importlib.import_module(f"codex_lab.{m.name}")
    shadowed = [n for n in codex_lab.__all__ if isinstance(getattr(codex_lab, n), types.ModuleType)]
    assert not shadowed, f"public names shadowed by a submodule of the same name: {shadowed}"


def test_a_module_exports_only_what_it_defines():
    """No module but a package's __init__ re-exports: every name in a module's __all__ is defined
    there (a function, class or assignment), so a name has one import path, its home. The
    counterfactual: a module listing an imported name is named with its home."""
    import ast

    def reexports(source: str) -> list[tuple[str, str]]:
        tree = ast.parse(source)
        defined, imported, names = set(), {}, []
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                for tg in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    if isinstance(tg, ast.Name):
                        defined.add(tg.id)
                        if tg.id == "__all__":
                            names = [e.value for e in node.value.elts]
            elif isinstance(node, ast.ImportFrom):
                for a in node.names:
                    imported[a.asname or a.name] = node.module
        return [(n, imported[n]) for n in names if n not in defined and n in imported]

    assert reexports("from a.b import x\n__all__ = ['x', 'y']\ny = 1\n") == [("x", "a.b")]
    pkg = ROOT / "codex_lab"
    bad = [f"{p.relative_to(pkg.parent)}: {n} (defined in {home})" for p in sorted(pkg.rglob("*.py"))
           if p.name != "__init__.py" for n, home in reexports(p.read_text(encoding="utf-8"))]
    assert not bad, "re-exported names: import them from where they are defined, and drop them from __all__:\n" + \
        "\n".join(bad)
