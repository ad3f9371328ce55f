"""The mode is resolved once, by an entry point, and passed along: resolve_mode's order of
precedence, Mode.pick, and a scan that fails when a package module reads a mode of its own."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from codex_lab.runtime.mode import MODES, Mode, resolve_mode

PACKAGE = Path(__file__).parents[1] / "codex_lab"


def test_precedence_flag_then_mode_then_fast_then_ci_then_device():
    env = {"CODEX_LAB_MODE": "standard", "CODEX_LAB_FAST": "1", "CI": "true"}
    assert resolve_mode("full", env=env, device="cpu").source == "flag"
    m = resolve_mode(None, env=env, device="cpu")
    assert (m.name, m.source) == ("standard", "env")  # CODEX_LAB_MODE beats CODEX_LAB_FAST
    assert resolve_mode(None, env={"CODEX_LAB_FAST": "0", "CI": "true"}, device="cpu").name == "full"
    ci = resolve_mode(None, env={"CI": "true"}, device="cuda")
    assert (ci.name, ci.source) == ("fast", "ci")
    assert resolve_mode(None, env={"CI": "false"}, device="cuda").name == "full"  # a GPU's default
    laptop = resolve_mode(None, env={}, device="cpu")
    assert (laptop.name, laptop.source) == ("standard", "device") and "CPU" in laptop.reason


def test_pick_and_the_two_flags():
    fast, std, full = (Mode(n) for n in MODES)
    assert [m.pick(fast=1, full=2, standard=3) for m in (fast, std, full)] == [1, 3, 2]
    assert std.pick(fast=1, full=2) == 1  # standard keeps the fast size unless it names its own
    assert (fast.fast, std.fast, full.fast) == (True, True, False)  # laptop sizes
    assert (fast.converge, std.converge, full.converge) == (False, True, True)  # quality runs sized to plateau
    assert "--mode standard" in fast.how_to_switch() and "--mode fast" in full.how_to_switch()


@pytest.mark.parametrize("flag,env,match", [
    ("medium", {}, "'medium' is not understood"),
    (None, {"CODEX_LAB_MODE": "quick"}, "CODEX_LAB_MODE='quick'.*fast, standard, full"),
    (None, {"CODEX_LAB_FAST": "maybe"}, "CODEX_LAB_FAST='maybe'.*1 \\(fast\\) or 0 \\(full\\)"),
])
def test_bad_modes_name_the_problem_and_the_choices(flag, env, match):
    with pytest.raises(ValueError, match=match):
        resolve_mode(flag, env=env, device="cpu")
    with pytest.raises(ValueError, match="not understood"):
        Mode("quick")


def test_the_command_line_passes_the_mode_to_the_command(monkeypatch):
    from codex_lab import cli
    from codex_lab.commands import report

    seen = {}
    monkeypatch.setattr(report, "main", lambda args: seen.update(mode=args.mode) or 0)
    monkeypatch.setenv("CODEX_LAB_MODE", "fast")
    assert cli.main(["--mode", "standard", "report"]) == 0  # the top-level flag takes all three modes
    assert seen["mode"].name == "standard" and seen["mode"].source == "flag"
    assert cli.main(["report", "--mode", "full"]) == 0 and seen["mode"].name == "full"
    assert cli.main(["report"]) == 0 and seen["mode"].source == "env"  # nothing of the flag stays behind


# The entry points allowed to resolve a mode (read the flag or the environment), and what they are.
ENTRY_POINTS = {
    "cli.py": "the command line",
    "runtime/__init__.py": "lesson_header: a notebook's first cell",
    "runtime/mode.py": "the resolution itself",
}
MODE_VARIABLES = ("CODEX_LAB_MODE", "CODEX_LAB_FAST")


def _reads_a_mode(path: Path) -> list[str]:
    """What in ``path`` reads a mode of its own: a call of resolve_mode or a mode variable named."""
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if name in ("resolve_mode", "mode_info", "fast_mode", "set_mode", "mode_override"):
                found.append(f"line {node.lineno}: {name}()")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in MODE_VARIABLES:
            found.append(f"line {node.lineno}: {node.value!r}")
    return sorted(found, key=lambda s: int(s.split(":")[0].split()[1]))


def test_no_package_module_reads_a_global_mode():
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in ENTRY_POINTS:
            continue
        hits = _reads_a_mode(path)
        if hits:
            offenders[rel] = hits
    assert not offenders, (f"modules that read a mode instead of being passed one: {offenders}; take a "
                           "codex_lab.runtime.Mode (or its name) as an argument from the entry point")


def test_the_scan_catches_a_module_that_reads_the_mode(tmp_path):
    # the counterfactual: the scan above is not empty-handed by construction
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nfrom codex_lab.runtime import resolve_mode\n\n"
                   "def size():\n    return 8 if resolve_mode().fast else 64\n\n"
                   "def other():\n    return os.environ.get('CODEX_LAB_FAST')\n")
    assert _reads_a_mode(bad) == ["line 5: resolve_mode()", "line 8: 'CODEX_LAB_FAST'"]
