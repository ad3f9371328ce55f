"""The native kernel cache loads only what it built: a library planted under the expected name
(its constructor would run on dlopen) is rebuilt over, never loaded; a folder others can write
is refused with the reason in native_status() / moe_native_status() (issue 30)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from codex_lab.nn import native_build
from codex_lab.nn.native_build import DIGEST_SUFFIX, load_native, so_path

CC = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(CC is None or os.environ.get("CODEX_LAB_NATIVE", "1") == "0",
                                reason="needs a C compiler and the native kernels on")
NAME, FLAGS = "moe_swiglu", ("-ffinite-math-only",)  # the MoE kernel, as moe_native loads it


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh private cache folder; load_native's per-process memo cleared before and after."""
    folder = tmp_path / "native"
    monkeypatch.setenv("CODEX_LAB_NATIVE_DIR", str(folder))
    load_native.cache_clear()
    yield folder
    load_native.cache_clear()


def plant(so: Path, marker: Path) -> None:
    """Compile a library whose constructor creates ``marker`` and put it at ``so``."""
    so.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    src = so.parent / "evil.c"
    src.write_text('#include <stdio.h>\n__attribute__((constructor)) static void run(void) {\n'
                   f'  FILE *f = fopen("{marker}", "w"); if (f) {{ fputs("ran", f); fclose(f); }}\n}}\n'
                   "int moe_swiglu(void) { return 0; }\n")
    subprocess.run([CC, "-shared", "-fPIC", str(src), "-o", str(so)], check=True, capture_output=True)
    src.unlink()


def test_planted_library_is_rebuilt_over_not_loaded(cache, tmp_path):
    so, marker = so_path(NAME, FLAGS), tmp_path / "constructor_ran"
    assert so.parent == cache
    plant(so, marker)
    lib, why = load_native(NAME, FLAGS)
    assert not marker.exists(), "the planted library's constructor ran"
    assert lib is not None and why == "", why
    record = json.loads(so.with_name(so.name + DIGEST_SUFFIX).read_text())
    import hashlib
    assert record["sha256"] == hashlib.sha256(so.read_bytes()).hexdigest()


def test_planted_library_with_a_stale_digest_is_not_loaded(cache, tmp_path):
    so, marker = so_path(NAME, FLAGS), tmp_path / "constructor_ran"
    assert load_native(NAME, FLAGS)[0] is not None  # a genuine build and its digest
    load_native.cache_clear()
    plant(so, marker)  # the library swapped, the digest left as it was
    lib, why = load_native(NAME, FLAGS)
    assert not marker.exists() and lib is not None and why == "", why


def test_a_symlink_under_the_expected_name_is_not_followed(cache, tmp_path):
    so, marker = so_path(NAME, FLAGS), tmp_path / "constructor_ran"
    evil = tmp_path / "elsewhere" / "evil.so"
    plant(evil, marker)
    so.parent.mkdir(parents=True, mode=0o700)
    so.symlink_to(evil)
    lib, why = load_native(NAME, FLAGS)
    assert not marker.exists() and lib is not None and why == "", why
    assert not so.is_symlink()


def test_good_build_is_reused_not_rebuilt(cache):
    assert load_native(NAME, FLAGS)[0] is not None
    so = so_path(NAME, FLAGS)
    before = so.stat().st_ino, so.stat().st_mtime_ns
    load_native.cache_clear()
    assert load_native(NAME, FLAGS)[0] is not None
    assert (so.stat().st_ino, so.stat().st_mtime_ns) == before


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702])
def test_folder_writable_by_others_is_refused_with_the_reason(cache, tmp_path, mode):
    from codex_lab.nn.moe_native import moe_native_status
    from codex_lab.nn.sparse_native import native_status

    so, marker = so_path(NAME, FLAGS), tmp_path / "constructor_ran"
    plant(so, marker)
    cache.chmod(mode)
    for status in (moe_native_status(), native_status()):
        assert "writable by group or others" in status and str(cache) in status and "chmod 700" in status, status
    assert not marker.exists()
    cache.chmod(0o700)  # fixed as the message says: the kernel is rebuilt and loads
    load_native.cache_clear()
    assert moe_native_status() == "" and not marker.exists()


@pytest.mark.skipif(os.getuid() != 0, reason="chown to another user needs root")
def test_library_or_folder_owned_by_another_user(cache, tmp_path):
    so, marker = so_path(NAME, FLAGS), tmp_path / "constructor_ran"
    assert load_native(NAME, FLAGS)[0] is not None
    load_native.cache_clear()
    plant(so, marker)
    side = so.with_name(so.name + DIGEST_SUFFIX)
    import hashlib
    side.write_text(json.dumps({"sha256": hashlib.sha256(so.read_bytes()).hexdigest()}))
    os.chown(so, 12345, 12345)  # a matching digest, but the file is not this user's
    lib, why = load_native(NAME, FLAGS)
    assert not marker.exists() and lib is not None and why == "", why
    load_native.cache_clear()
    os.chown(cache, 12345, 12345)
    lib, why = load_native(NAME, FLAGS)
    assert lib is None and "owned by uid 12345" in why, why
    assert native_build.check_cache_dir(cache) == why


@pytest.mark.parametrize("sidecar", [b"[" * 4096, b"\xff\xfe garbage", b"", b"[1, 2]", b'{"sha256": 7}'])
def test_a_garbage_digest_sidecar_is_rebuilt_over_never_a_traceback(cache, sidecar):
    # the digest file is read with a 4 KiB cap; 4096 nested brackets made json raise
    # RecursionError, which escaped load_native (and every kernel's caller) as a traceback
    so = so_path(NAME, FLAGS)
    assert load_native(NAME, FLAGS)[0] is not None
    load_native.cache_clear()
    side = so.with_name(so.name + DIGEST_SUFFIX)
    side.write_bytes(sidecar)
    os.chmod(side, 0o644)
    lib, why = load_native(NAME, FLAGS)
    assert lib is not None and why == "", why
    assert json.loads(side.read_text())["sha256"]  # a fresh digest was written beside the rebuild
