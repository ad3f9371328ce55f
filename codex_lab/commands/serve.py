"""codex-lab serve: the OpenAI-compatible completions server (loopback by default).

Every limit flag is checked before the model loads: a negative, NaN or absurd value is
refused with one line naming the flag and its range (exit status 2).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

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
    p.add_argument("--max-batch-size", type=int, default=8)
    p.add_argument("--max-waiting", type=int, default=32, help="queued requests beyond the batch; more get 429")
    p.add_argument("--deadline-s", type=float, default=30.0, help="seconds a request may take (seed: 30)")
    p.add_argument("--max-tokens", type=int, default=256, help="largest max_tokens a request may ask for")
    p.add_argument("--allowed-hosts", default=None,
                   help="comma-separated names accepted in the Host header ('*' = any; default: loopback names)")
    p.add_argument("--api-key", default=None,
                   help=f"require 'Authorization: Bearer KEY' (default: the {API_KEY_ENV} environment variable; "
                        "none = no key)")
    p.add_argument("--header-timeout-s", type=float, default=10.0, help="seconds to send request headers")
    p.add_argument("--body-timeout-s", type=float, default=10.0, help="seconds to send a request body (else 408)")
    p.add_argument("--max-connections", type=int, default=256, help="open connections at most (one more: 503)")
    p.add_argument("--no-compile", action="store_true",
                   help="decode with the eager engine step instead of the compiled fixed-shape one "
                        "(the compiled step is compiled in the background while the eager one serves: 7 graphs for the shipped model, "
                        "about 36 s on 2 CPU cores with Inductor's cache warm, longer the very first time)")
    p.add_argument("--device", default=None)


def build_config(args: argparse.Namespace) -> "ServerConfig":  # noqa: F821
    """The :class:`~codex_lab.serve.router.ServerConfig` of the flags; InputError on a bad value."""
    from codex_lab.errors import InputError
    from codex_lab.serve.protocol import Limits
    from codex_lab.serve.router import LOOPBACK, ServerConfig

    if not 0 <= args.port <= 65535:
        raise InputError(f"--port must be in 0..65535, got {args.port}")
    hosts = LOOPBACK if args.allowed_hosts is None else tuple(h.strip() for h in args.allowed_hosts.split(",") if h.strip())
    key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV) or None
    cfg = ServerConfig(model_name=args.model_name, max_batch_size=args.max_batch_size, max_waiting=args.max_waiting,
                       deadline_s=args.deadline_s, limits=Limits(max_tokens=args.max_tokens), allowed_hosts=hosts,
                       api_key=key, header_timeout_s=args.header_timeout_s, body_timeout_s=args.body_timeout_s,
                       max_connections=args.max_connections)
    try:
        cfg.validate()
    except InputError as exc:  # name the flag, not the field
        msg = str(exc)
        field = msg.split(" ", 1)[0]
        if hasattr(args, field):
            msg = "--" + field.replace("_", "-") + msg[len(field):]
        raise InputError(msg) from None
    return cfg


def compiled_engine(model: Any, tokenizer: Any, **kw: Any) -> Any:
    """An :class:`~codex_lab.infer.engine.Engine` with the compiled decode step. It serves at
    once: every bucket compiles in a background thread while steps run the same padded step
    eagerly (the same tokens), and all steps switch to the graphs when the last one is built
    (about 35-95 s on 2 CPU cores; the first answer does not wait for it). Prints what it did."""
    import time

    from codex_lab.infer.engine import Engine

    eng = Engine(model, tokenizer, compile=True, **kw)
    t0 = time.perf_counter()
    step = eng.fast_step

    def done(per: dict[int, float]) -> None:
        if step.compiled:
            print(f"compiled {len(per)} decode buckets in {time.perf_counter() - t0:.1f} s: "
                  "steps now run the compiled graphs", flush=True)
        else:
            print(f"compiling failed, decoding eagerly: {step.compile_error}", flush=True)

    if step.compiled:
        print("serving now with the eager decode step; compiling the fast one in the background "
              "(one graph per block bucket)...", flush=True)
        step.warmup_background(done)
    else:
        done({})
    return eng


def main(args: argparse.Namespace) -> int:
    import uvicorn

    from codex_lab.runtime import get_device
    from codex_lab.serve.app import ModelServer, check_loopback, create_app
    from codex_lab.serve.registry import Registry
    from codex_lab.serve.security import uvicorn_config
    from codex_lab.training.checkpoint import load_checkpoint, load_pretrained

    check_loopback(args.host)
    cfg = build_config(args)
    device = get_device(args.device)
    if args.registry:
        reg = Registry(args.registry)
        ck = reg.load(device=device)
        version = reg.current() or "v0001"
    elif getattr(args, "hf", None):
        from codex_lab.hf.folder import load_hf_folder

        ck = load_hf_folder(args.hf, device)
        version = "v0001"
    else:
        ck = load_checkpoint(args.checkpoint, device) if args.checkpoint else load_pretrained(device)
        version = "v0001"
    if float(ck.meta.get("fim_rate", 0) or 0) > 0:  # FIM-trained: serve `suffix` in its prompt format
        cfg.fim_format = str(ck.meta.get("fim_format", "psm"))
    server = ModelServer(ck.tokenizer, cfg, engine_factory=None if args.no_compile else compiled_engine)
    server.add_version(version, ck.model)
    auth = "API key required" if cfg.api_key else "no API key"
    print(f"serving {args.model_name} ({version}) on http://{args.host}:{args.port}/v1  (metrics: /metrics; {auth})")
    uvicorn.Server(uvicorn_config(create_app(server), cfg, host=args.host, port=args.port)).run()
    return 0
