"""codex-lab corpus: sizes of the embedded (or a given) code corpus."""

from __future__ import annotations

import argparse

NAME = "corpus"
HELP = "show the corpus statistics (files, characters, lines per split; skipped files)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--corpus", default=None, help="folder of code (default: the Python standard library)")
    p.add_argument("--max-file-bytes", type=int, default=None,
                   help="skip (and count) files larger than this many bytes (default 1000000)")


def main(args: argparse.Namespace) -> int:
    from codex_lab.data.corpus import DEFAULT_MAX_FILE_BYTES, load_corpus

    cap = DEFAULT_MAX_FILE_BYTES if args.max_file_bytes is None else args.max_file_bytes
    c = load_corpus(args.corpus, max_file_bytes=cap)
    for k, v in c.stats().items():
        print(f"{k:>20}: {v:,}" if isinstance(v, int) else f"{k:>20}: {v}")
    return 0
