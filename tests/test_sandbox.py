"""The sandbox for generated code (codex_lab.sandbox.run_python) replays the escapes of the
hardening issue and asserts each one is blocked: writes and deletes outside its folder,
/etc/shadow, the parent's environment, network (_socket, UDP, ctypes), subprocess, 50 forks
and a detached daemon outliving the call, 500 MB of output, killing the parent.

The boundary (separate uid, pid/net/mount namespaces) needs root and util-linux unshare;
where it is missing those cases are skipped with the reason. The guard, the timeout and
the output cap hold in every mode and are tested in the fallback mode too.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from pathlib import Path

import pytest

from codex_lab.sandbox import SandboxResult, isolation_mode, run_python

ROOT = Path(__file__).resolve().parents[1]
MODE = isolation_mode()
needs_root = pytest.mark.skipif(MODE != "root", reason=f"isolation mode is {MODE!r}: needs root and util-linux unshare")
needs_ns = pytest.mark.skipif(MODE == "plain", reason="no pid/net namespaces here (not Linux, or unshare unavailable)")


def _alive(marker: str) -> list[int]:
    """Host pids whose command line contains ``marker``."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if marker.encode() in (d / "cmdline").read_bytes():
                    found.append(int(d.name))
            except OSError:
                pass
    return [p for p in found if p != os.getpid()]


@pytest.fixture()
def outside(tmp_path_factory):
    """A folder outside /tmp (the sandbox gets a private /tmp) holding a root-owned sentinel."""
    base = ROOT / ".pytest_cache" / f"sandbox-outside-{os.getpid()}-{secrets.token_hex(4)}"
    base.mkdir(parents=True)
    (base / "sentinel.txt").write_text("keep")
    yield base
    for p in base.iterdir():
        p.unlink()
    base.rmdir()


def test_result_shape_and_ok():
    r = run_python("print(6 * 7)")
    assert isinstance(r, SandboxResult) and r.ok and r.stdout.strip() == "42" and not r.timed_out
    bad = run_python("raise SystemExit(3)")
    assert not bad.ok and bad.returncode == 3
    fut = run_python("from __future__ import annotations\nimport sys\nprint(__name__)\nraise ValueError('line 4')")
    assert fut.stdout.strip() == "__main__" and 'main.py", line 4' in fut.stderr, fut  # the code's own file and lines


@needs_root
def test_runs_as_an_unprivileged_uid_with_a_process_limit():
    r = run_python("import os, resource\nprint(os.getuid(), os.getgid(), resource.getrlimit(resource.RLIMIT_NPROC)[0])", nproc=17)
    uid, gid, nproc = map(int, r.stdout.split())
    assert uid != 0 and gid != 0 and nproc == 17, r


@needs_root
def test_write_and_delete_outside_fail(outside):
    code = f"""
import posix
for attempt in (lambda: open({str(outside / 'sentinel.txt')!r}, 'w').write('pwned'),
                lambda: posix.unlink({str(outside / 'sentinel.txt')!r}),
                lambda: open({str(outside / 'new.txt')!r}, 'w').write('pwned'),
                lambda: open({str(ROOT / 'PWNED_BY_SANDBOX')!r}, 'w').write('pwned')):
    try:
        attempt()
        print('DONE')
    except OSError as e:
        print('BLOCKED', type(e).__name__)
"""
    r = run_python(code)
    assert r.stdout.count("BLOCKED") == 4 and "DONE" not in r.stdout, r
    assert (outside / "sentinel.txt").read_text() == "keep"
    assert not (outside / "new.txt").exists() and not (ROOT / "PWNED_BY_SANDBOX").exists()


@needs_root
def test_tmp_is_private(tmp_path):
    (tmp_path / "host.txt").write_text("host")
    r = run_python(f"import os\nprint(os.path.exists({str(tmp_path / 'host.txt')!r}))\nopen('/tmp/dropped', 'w').write('x')")
    assert r.ok and r.stdout.strip() == "False", r
    assert not Path("/tmp/dropped").exists()


@needs_root
@pytest.mark.skipif(not Path("/etc/shadow").exists(), reason="this system has no /etc/shadow")
def test_etc_shadow_unreadable():
    r = run_python("print(open('/etc/shadow').read())")
    assert not r.ok and "PermissionError" in r.stderr and "root:" not in r.stdout, r


@needs_ns
def test_parent_environment_unreadable(monkeypatch):
    token = secrets.token_hex(16)
    monkeypatch.setenv("CODEX_LAB_TEST_SECRET", token)
    code = f"""
import os
for pid in ({os.getpid()}, os.getppid(), 1, {os.getppid()}):
    try:
        print(open(f'/proc/{{pid}}/environ', 'rb').read())
    except OSError as e:
        print('BLOCKED', pid, type(e).__name__)
print(dict(os.environ))
"""
    r = run_python(code)
    assert token not in r.stdout and token not in r.stderr, r
    assert "BLOCKED" in r.stdout


@needs_ns
def test_no_network_tcp_via_raw_socket_module():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    srv.setblocking(False)
    port = srv.getsockname()[1]
    code = f"""
import _socket
s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
s.settimeout(3)
try:
    s.connect(('127.0.0.1', {port}))
    print('CONNECTED')
except OSError as e:
    print('BLOCKED', e)
"""
    r = run_python(code)
    time.sleep(0.2)
    with pytest.raises(BlockingIOError):
        srv.accept()  # nobody connected
    srv.close()
    assert "CONNECTED" not in r.stdout and "BLOCKED" in r.stdout, r


@needs_ns
def test_no_network_udp():
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.setblocking(False)
    port = rx.getsockname()[1]
    code = f"""
import _socket
s = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
try:
    s.sendto(b'leak', ('127.0.0.1', {port}))
    print('SENT')
except OSError as e:
    print('BLOCKED', e)
"""
    run_python(code)
    time.sleep(0.2)
    with pytest.raises(BlockingIOError):
        rx.recvfrom(100)  # nothing arrived
    rx.close()


@needs_ns
def test_ctypes_reaches_neither_the_parent_nor_the_files(outside):
    code = f"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
print('KILL', libc.kill({os.getpid()}, 0))
print('UNLINK', libc.unlink({str(outside / 'sentinel.txt').encode()!r}))
print('SYSTEM', libc.system(b'echo pwned > {outside / 'ctypes.txt'}'))
"""
    r = run_python(code)
    assert "KILL -1" in r.stdout, r  # kill(pid, 0) = -1: the parent is not even addressable
    if MODE == "root":
        assert "UNLINK -1" in r.stdout and (outside / "sentinel.txt").read_text() == "keep"
        assert not (outside / "ctypes.txt").exists()


def test_subprocess_and_os_system_are_disabled(outside):
    target = outside / "sub.txt"
    code = f"""
import os, subprocess
for call in (lambda: subprocess.run(['sh', '-c', 'echo pwned > {target}']),
             lambda: os.system('echo pwned > {target}'),
             lambda: os.popen('echo pwned > {target}')):
    try:
        call()
        print('RAN')
    except PermissionError as e:
        print('BLOCKED', e)
"""
    r = run_python(code)
    assert r.stdout.count("BLOCKED") == 3 and "RAN" not in r.stdout, r
    assert not target.exists()


@needs_ns
def test_fifty_forks_do_not_outlive_the_timeout():
    marker = f"codexlabforkmarker{secrets.token_hex(6)}"
    code = f"""
import posix, sys, time
for _ in range(50):
    try:
        if posix.fork() == 0:
            posix.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(600)', '{marker}'])
    except OSError:
        pass
time.sleep(600)
"""
    r = run_python(code, timeout_s=4)
    assert r.timed_out
    time.sleep(0.5)
    assert _alive(marker) == [], "forked children survived run_python"


@needs_ns
def test_a_detached_daemon_does_not_survive():
    marker = f"codexlabdaemonmarker{secrets.token_hex(6)}"
    code = f"""
import posix, sys
if posix.fork() == 0:
    posix.setsid()
    if posix.fork() == 0:
        posix.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(600)', '{marker}'])
    posix._exit(0)
print('parent done')
"""
    r = run_python(code, timeout_s=10)
    assert r.ok, r
    time.sleep(0.5)
    assert _alive(marker) == [], "the daemon outlived run_python"


def test_500_mb_of_output_is_capped():
    cap = 1 << 20
    t = time.monotonic()
    r = run_python("import sys\nchunk = b'x' * (1 << 20)\nfor _ in range(500):\n    sys.stdout.buffer.write(chunk)\n",
                   timeout_s=60, max_output_bytes=cap)
    assert r.truncated and not r.ok and len(r.stdout) <= cap, (len(r.stdout), r.truncated)
    assert not r.timed_out and time.monotonic() - t < 60  # stopped at the cap, not at the timeout


@needs_ns
def test_killing_the_parent_fails():
    code = f"""
import os, posix
for pid, kill in ((os.getppid(), os.kill), (os.getppid(), posix.kill), ({os.getpid()}, posix.kill)):
    try:
        kill(pid, 9)
        print('KILLED', pid)
    except (PermissionError, ProcessLookupError) as e:
        print('BLOCKED', type(e).__name__)
"""
    r = run_python(code)
    assert r.stdout.count("BLOCKED") == 3, r  # and this test process is still alive to check it


def test_timeout_kills_the_child():
    t = time.monotonic()
    r = run_python("while True:\n    pass\n", timeout_s=2)
    assert r.timed_out and not r.ok and r.returncode is None
    assert time.monotonic() - t < 30


@needs_ns
def test_hidden_paths_are_empty(outside):
    r = run_python(f"import os\nprint(os.listdir({str(outside)!r}))", hide=[str(outside)])
    assert r.stdout.strip() == "[]", r


def test_fallback_mode_keeps_guard_timeout_and_cap(monkeypatch):
    monkeypatch.setenv("CODEX_LAB_SANDBOX", "plain")
    assert isolation_mode() == "plain"
    r = run_python("import os\ntry:\n    os.kill(os.getpid(), 0)\nexcept PermissionError as e:\n    print('BLOCKED', e)\n")
    assert r.mode == "plain" and "BLOCKED" in r.stdout, r
    assert run_python("while True:\n    pass\n", timeout_s=1).timed_out
    assert run_python("print('x' * 5_000_000)", max_output_bytes=1000).truncated


def test_a_nested_sandbox_still_starts_after_the_guard():
    """Grader checks (trusted) may run generated code in a sandbox of their own, although
    the guard has disabled subprocess for the submission in the same child."""
    code = """
from codex_lab.sandbox import run_python
from codex_lab.sandbox.guard import install
install()
import subprocess
try:
    subprocess.run(['true'])
    print('SUBPROCESS RAN')
except PermissionError:
    print('SUBPROCESS BLOCKED')
r = run_python('print(6 * 7)')
print('NESTED', r.ok, r.stdout.strip())
"""
    r = run_python(code, guard=False, timeout_s=120, memory_mb=2048)
    assert "SUBPROCESS BLOCKED" in r.stdout and "NESTED True 42" in r.stdout, r
