"""codex-lab serve: the OpenAI-compatible completions server (loopback by default)."""

from __future__ import annotations

import argparse

NAME = "serve"
HELP = "serve a checkpoint (or a registry's current version) over an OpenAI-compatible API on 127.0.0.1"


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument("--checkpoint", default=None, help="checkpoint folder (default: the shipped tiny model)")
    src.add_argument("--registry", default=None, help="registry folder: serve its current version")
    p.add_argument("--host", default="127.0.0.1", help="loopback only (127.0.0.1, localhost, ::1)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model-name", default="codex-lab-tiny", help="the `model` clients send")
    p.add_argument("--max-batch-size", type=int, default=8)
    p.add_argument("--max-waiting", type=int, default=32, help="queued requests beyond the batch; more get 429")
    p.add_argument("--deadline-s", type=float, default=30.0, help="seconds a request may take (seed: 30)")
    p.add_argument("--max-tokens", type=int, default=256, help="largest max_tokens a request may ask for")
    p.add_argument("--device", default=None)


def main(args: argparse.Namespace) -> int:
    import uvicorn

    from codex_lab.training.checkpoint import load_checkpoint, load_pretrained
    from codex_lab.serve.protocol import Limits
    from codex_lab.serve.registry import Registry
    from codex_lab.runtime import get_device
    from codex_lab.serve.app import ModelServer, ServerConfig, check_loopback, create_app

    check_loopback(args.host)
    device = get_device(args.device)
    if args.registry:
        reg = Registry(args.registry)
        ck = reg.load(device=device)
        version = reg.current() or "v0001"
    else:
        ck = load_checkpoint(args.checkpoint, device) if args.checkpoint else load_pretrained(device)
        version = "v0001"
    cfg = ServerConfig(model_name=args.model_name, max_batch_size=args.max_batch_size, max_waiting=args.max_waiting,
                       deadline_s=args.deadline_s, limits=Limits(max_tokens=args.max_tokens))
    server = ModelServer(ck.tokenizer, cfg)
    server.add_version(version, ck.model)
    print(f"serving {args.model_name} ({version}) on http://{args.host}:{args.port}/v1  (metrics: /metrics)")
    uvicorn.run(create_app(server), host=args.host, port=args.port, log_level="warning")
    return 0
