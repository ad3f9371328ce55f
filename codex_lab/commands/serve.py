"""codex-lab serve: the OpenAI-compatible completions server (loopback by default).

Every limit flag is checked before the model loads: a negative, NaN or absurd value is
refused with one line naming the flag and its range (exit status 2).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from typing import Any

from codex_lab.serve.compiled import compiled_engine


NAME = "serve"
HELP = "serve a checkpoint (or a registry's current version) over an OpenAI-compatible API on 127.0.0.1"
API_KEY_ENV = "CODEX_LAB_API_KEY"


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument("--checkpoint", default=None, help="checkpoint folder (default: the shipped tiny model)")
    src.add_argument("--hf", default=None, metavar="DIR",
                     help="Hugging Face save_pretrained folder (Llama, Qwen2, Mixtral), converted offline")
    src.add_argument("--registry", default=None, help="registry folder: serve its current version")
    p.add_argument("--host", default="127.0.0.1", help="loopback only (127.0.0.1, localhost, ::1)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model-name", default="codex-lab-tiny", help="the `model` clients send")
    p.add_argument("--max-batch-size", type=int, default=16,
                   help="requests decoded together (a busy editor sends more than 8; at 16 streams a server of 8 "
                        "slots queued half of them: TTFT p95 254 ms against 36-68 ms with 16, 2026-12-02)")
    p.add_argument("--max-waiting", type=int, default=32, help="queued requests beyond the batch; more get 429")
    p.add_argument("--deadline-s", type=float, default=30.0, help="seconds a request may take (seed: 30)")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="operator cap on a request's max_tokens (default: none; a request without max_tokens "
                        "gets what the context leaves after its prompt, as vLLM)")
    p.add_argument("--lenient", action="store_true",
                   help="ignore request fields the server does not know (default: a 400 naming the field and "
                        "listing the supported ones), for clients that send extras")
    p.add_argument("--allowed-hosts", default=None,
                   help="comma-separated names accepted in the Host header ('*' = any; default: loopback names)")
    p.add_argument("--api-key", default=None,
                   help=f"require 'Authorization: Bearer KEY' (default: the {API_KEY_ENV} environment variable; "
                        "none = no key). Prefer the variable or --api-key-file: a flag is visible to every local "
                        "user in /proc/PID/cmdline until the server blanks it out at start")
    p.add_argument("--api-key-file", default=None, metavar="FILE",
                   help="read the API key from FILE (first line; the file must not be readable by group or others)")
    p.add_argument("--header-timeout-s", type=float, default=10.0, help="seconds to send request headers")
    p.add_argument("--body-timeout-s", type=float, default=10.0, help="seconds to send a request body (else 408)")
    p.add_argument("--max-connections", type=int, default=256, help="open connections at most (one more: 503)")
    p.add_argument("--no-compile", action="store_true",
                   help="decode with the eager engine step only: nothing compiles, and the server is ready (GET /ready) "
                        "as soon as the model is loaded. By default the faster fixed-shape step compiles in the "
                        "background (three graphs with the weights frozen and Inductor's C++ GEMM template: the "
                        "batch, the batch with arriving prompts, a request alone; GET /health shows graphs done / "
                        "total), compiled ahead of time and kept in the compile cache: the first start builds them, "
                        "a restart loads them (docs/PERFORMANCE.md has the times); the compiled step replaces "
                        "the eager one when every graph is there")
    p.add_argument("--engine-process", action="store_true",
                   help="run the engine in a process of its own: HTTP parsing and SSE writing never wait on the "
                        "engine's Python (one interpreter lock each); the model is copied into that process")
    p.add_argument("--aten-matmuls", action="store_true",
                   help="compile with ATen's matmuls over unfrozen weights instead: one graph per block bucket, "
                        "cached on disk, so a restart of the same model with the same torch has them in seconds; "
                        "many streams decode slower (docs/PROFILE.md)")
    wait = p.add_mutually_exclusive_group()
    wait.add_argument("--serve-while-compiling", dest="wait_ready", action="store_false", default=False,
                      help="the default: answer completions at once with the eager step while the graphs compile "
                           "(GET /health: phase 'warming'; GET /ready: 503 until 'ready')")
    wait.add_argument("--wait-ready", dest="wait_ready", action="store_true",
                      help="answer completions with 503 and Retry-After until the compiled graphs serve (or the "
                           "compile failed and the eager step is all there is)")
    p.add_argument("--device", default=None)


def read_key_file(path: str) -> str:
    """The API key in ``path`` (its first line); InputError naming the file and the fix when it is
    missing, empty, too long, or readable by group or others."""
    import stat

    from codex_lab.errors import InputError, MissingFileError

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise MissingFileError(f"--api-key-file {path}: no such file; write the key into it (chmod 600)") from None
    except OSError as exc:
        raise InputError(f"--api-key-file {path}: cannot read it ({exc.strerror}); check the path") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"--api-key-file {path}: not a regular file; write the key into a file (chmod 600)")
        if st.st_mode & 0o077:
            raise InputError(f"--api-key-file {path}: readable or writable by group or others "
                             f"(mode {stat.S_IMODE(st.st_mode):o}); run chmod 600 {path}")
        raw = f.read(4097)
    key = raw.decode("utf-8", "replace").splitlines()[0].strip() if raw.strip() else ""
    if not key or len(raw) > 4096:
        raise InputError(f"--api-key-file {path}: expected one line holding the key (at most 4 KiB), "
                         f"got {'nothing' if not key else 'more'}; write the key alone into it")
    return key


def api_key_of(args: argparse.Namespace) -> str | None:
    """The key from --api-key, --api-key-file or $CODEX_LAB_API_KEY (in that order; None = no key)."""
    from codex_lab.errors import InputError

    if args.api_key is not None and getattr(args, "api_key_file", None):
        raise InputError("--api-key and --api-key-file both given; keep --api-key-file (a flag is visible to other users)")
    if getattr(args, "api_key_file", None):
        return read_key_file(args.api_key_file)
    return args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV) or None


def scrub_argv(secret: str) -> bool:
    """Overwrite every copy of ``secret`` in this process's original argv memory (what
    /proc/PID/cmdline shows to every local user) with ``*``; True when it was found and blanked.

    Linux only: the argv area's bounds are fields 48-49 of /proc/self/stat (arg_start, arg_end),
    and the bytes are written in place with the same length, so the rest of the command line
    keeps its shape. Elsewhere it does nothing and returns False.
    """
    import ctypes

    try:
        fields = open("/proc/self/stat", "rb").read().rsplit(b")", 1)[1].split()
        # fields after "(comm)" start at field 3: arg_start is field 48, arg_end field 49
        start, end = int(fields[45]), int(fields[46])
        if not 0 < start < end or end - start > 1 << 20:
            return False
        area = ctypes.string_at(start, end - start)
    except (OSError, ValueError, IndexError):
        return False
    needle = secret.encode()
    found, at = False, area.find(needle)
    while needle and at >= 0:
        ctypes.memmove(start + at, b"*" * len(needle), len(needle))
        found, at = True, area.find(needle, at + len(needle))
    return found


def build_config(args: argparse.Namespace) -> "ServerConfig":  # noqa: F821
    """The :class:`~codex_lab.serve.router.ServerConfig` of the flags; InputError on a bad value."""
    from codex_lab.errors import InputError
    from codex_lab.serve.api_errors import NO_TOKEN_CAP, Limits
    from codex_lab.serve.router import LOOPBACK, ServerConfig

    if not 0 <= args.port <= 65535:
        raise InputError(f"--port must be in 0..65535, got {args.port}")
    hosts = LOOPBACK if args.allowed_hosts is None else tuple(h.strip() for h in args.allowed_hosts.split(",") if h.strip())
    key = api_key_of(args)
    cfg = ServerConfig(model_name=args.model_name, max_batch_size=args.max_batch_size, max_waiting=args.max_waiting,
                       deadline_s=args.deadline_s, limits=Limits(max_tokens=NO_TOKEN_CAP if args.max_tokens is None else args.max_tokens,
                                     lenient=bool(getattr(args, "lenient", False))), allowed_hosts=hosts,
                       api_key=key, header_timeout_s=args.header_timeout_s, body_timeout_s=args.body_timeout_s,
                       max_connections=args.max_connections,
                       engine_process=bool(getattr(args, "engine_process", False)))
    try:
        cfg.validate()
    except InputError as exc:  # name the flag, not the field
        msg = str(exc)
        field = msg.split(" ", 1)[0]
        if hasattr(args, field):
            msg = "--" + field.replace("_", "-") + msg[len(field):]
        raise InputError(msg) from None
    return cfg



def load_model(args: argparse.Namespace, device: Any) -> tuple[Any, str]:
    """(the checkpoint, its version name) that ``--checkpoint`` / ``--hf`` / ``--registry`` name."""
    from codex_lab.serve.registry import Registry
    from codex_lab.training.checkpoint import load_checkpoint, load_pretrained

    if args.registry:
        reg = Registry(args.registry)
        return reg.load(device=device), reg.current() or "v0001"
    if getattr(args, "hf", None):
        from codex_lab.hf.folder import load_hf_folder

        return load_hf_folder(args.hf, device), "v0001"
    return (load_checkpoint(args.checkpoint, device) if args.checkpoint else load_pretrained(device)), "v0001"


def main(args: argparse.Namespace) -> int:
    import threading

    import uvicorn

    from codex_lab.infer.engine.runner.options import freeze_long_lived
    import torch

    from codex_lab.runtime import compute_threads, get_device
    from codex_lab.serve.app import create_app
    from codex_lab.serve.router import ModelServer
    from codex_lab.serve.security import check_loopback, uvicorn_config
    from codex_lab.infer.compile_cache import use_compile_cache

    check_loopback(args.host)
    cfg = build_config(args)
    # the engine's math threads: the one setting every lesson uses (1 on a 2-core machine, so the
    # HTTP loop keeps a core: 2 threads gave TBT p95 at 16 streams 21.2 vs 17.9 ms, 2026-12-02)
    threads = compute_threads()
    torch.set_num_threads(threads)
    if args.api_key is not None:  # visible to every local user in /proc/PID/cmdline: blank it at once
        where = f"/proc/{os.getpid()}/cmdline"
        state = f"blanked out of {where} now; it was readable there until this line" if scrub_argv(args.api_key) \
            else f"it stays readable in {where} on this system"
        print(f"[codex-lab serve] warning: --api-key on the command line is visible to other local users ({state}, "
              f"and it is in your shell history); use {API_KEY_ENV}=... or --api-key-file FILE instead",
              file=sys.stderr, flush=True)
    device = get_device(args.device)
    cache = None
    if not args.no_compile:  # before the first compile: Inductor reads its folder then
        cache = use_compile_cache()  # said once the model has loaded, so a load error stays the only line
    # the HTTP server answers while the model loads (GET /health: phase "starting"; GET /ready: 503);
    # the tokenizer and the version arrive with the model
    factory = None if args.no_compile else functools.partial(compiled_engine, gemm_template=not args.aten_matmuls)
    server = ModelServer(None, cfg, engine_factory=factory)  # type: ignore[arg-type]
    uv = uvicorn.Server(uvicorn_config(create_app(server, wait_ready=args.wait_ready, compile_cache=cache), cfg,
                                       host=args.host, port=args.port))
    failed: list[BaseException] = []

    def load() -> None:
        try:
            ck, version = load_model(args, device)
            if float(ck.meta.get("fim_rate", 0) or 0) > 0:  # FIM-trained: serve `suffix` in its prompt format
                cfg.fim_format = str(ck.meta.get("fim_format", "psm"))
            server.tokenizer = ck.tokenizer
            server.add_version(version, ck.model)
            freeze_long_lived()  # loaded objects out of the collector's reach (the compile thread freezes its own too)
        except BaseException as exc:  # noqa: BLE001 (raised again on the main thread, once uvicorn stopped)
            failed.append(exc)
            uv.should_exit = True
            return
        if cache is not None:
            print(f"[codex-lab serve] compile cache: {cache['dir']}" if cache["active"] else
                  f"[codex-lab serve] warning: {cache['reason']}", file=sys.stderr, flush=True)
        auth = "API key required" if cfg.api_key else "no API key"
        print(f"serving {args.model_name} ({version}) on http://{args.host}:{args.port}/v1  (metrics: /metrics; "
              f"readiness: /ready; {auth}; {threads} math thread(s): CODEX_LAB_THREADS=N to change)", flush=True)

    threading.Thread(target=load, name="codex-lab-load", daemon=True).start()
    uv.run()
    if failed:
        raise failed[0]
    return 0
