"""codex-lab export DIR: the model as a folder transformers loads alone (and, with --gguf, a GGUF)."""

from __future__ import annotations

import argparse

NAME = "export"
HELP = "write a Hugging Face folder (weights, config, generation config, tokenizer) that transformers loads alone"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", metavar="DIR", help="folder to write (created; existing files are replaced)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--checkpoint", default=None, help="checkpoint folder (default: the shipped tiny model)")
    src.add_argument("--registry", default=None, help="registry folder: export its current version or --version")
    p.add_argument("--version", default=None, help="with --registry: the version to export (e.g. v0002)")
    p.add_argument("--arch", default=None, choices=["llama", "qwen2"],
                   help="transformers architecture (default: qwen2 when the model has q/k/v biases, else llama)")
    p.add_argument("--gguf", action="store_true",
                   help="also write DIR/model.gguf (llama architecture, with llama.cpp's FIM token keys) for "
                        "llama.cpp; needs the gguf package: pip install 'codex_lab[gguf]'")
    p.add_argument("--gguf-type", default="f32", choices=["f32", "f16", "q8_0"],
                   help="tensor type of the GGUF (implies --gguf): f32 (exact), f16, or q8_0 (llama.cpp's 8-bit "
                        "blocks of 32); norms stay f32, as llama.cpp's converter writes them")


def main(args: argparse.Namespace) -> int:
    from codex_lab.errors import InputError
    from codex_lab.hf.export import export_hf_folder
    from codex_lab.training.checkpoint import load_checkpoint, load_pretrained

    if args.version and not args.registry:
        raise InputError("--version picks a version of a registry; give --registry DIR too")
    if args.registry:
        from codex_lab.serve.registry import Registry

        ck = Registry(args.registry).load(args.version, device="cpu")
    else:
        ck = load_checkpoint(args.checkpoint, "cpu") if args.checkpoint else load_pretrained("cpu")
    gguf_type = getattr(args, "gguf_type", "f32")
    args.gguf = args.gguf or gguf_type != "f32"
    if args.gguf:  # checked before anything is written
        try:
            import gguf  # noqa: F401
        except ImportError:
            raise InputError("--gguf needs the gguf package: pip install 'codex_lab[gguf]' (or pip install gguf)") from None
    try:
        out = export_hf_folder(ck.model, ck.tokenizer, args.out, meta=ck.meta, arch=args.arch)
        print(f"wrote {out}: load it with AutoModelForCausalLM.from_pretrained({str(out)!r}) and AutoTokenizer")
        if args.gguf:
            from codex_lab.hf.gguf_export import export_gguf

            path = export_gguf(ck.model, ck.tokenizer, out / "model.gguf", gguf_type=gguf_type)
            print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB, llama architecture, {gguf_type})")
    except ValueError as exc:  # the model has something the target format lacks (named)
        raise InputError(f"cannot export this model: {exc}") from None
    return 0
