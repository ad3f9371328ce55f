"""codex-lab corpus: sizes of the embedded (or a given) code corpus."""

from __future__ import annotations

import argparse

NAME = "corpus"
HELP = "show the corpus statistics (files, characters, lines per split; skipped files)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--corpus", default=None, help="folder of code (default: the Python standard library)")


def main(args: argparse.Namespace) -> int:
    from codex_lab.data.corpus import load_corpus

    c = load_corpus(args.corpus)
    for k, v in c.stats().items():
        print(f"{k:>20}: {v:,}" if isinstance(v, int) else f"{k:>20}: {v}")
    return 0
