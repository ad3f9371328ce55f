"""Copy a finished `codex-lab train --preset tiny` run into codex_lab/assets/tiny and record
its syntax-validity rate and the command that regenerates it in meta.json. Absolute paths of
the build machine (corpus root, run folder) are replaced by descriptions (``portable_meta``).

    codex-lab train --preset tiny --out runs/tiny                          # 600 steps
    codex-lab train --preset tiny --out runs/tiny --steps 1200 --resume    # 600 more
    python scripts/ship_checkpoint.py runs/tiny/checkpoint --prompts 32 \
        --command "codex-lab train --preset tiny --out runs/tiny && codex-lab train --preset tiny --out runs/tiny --steps 1200 --resume"
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

from codex_lab.training.checkpoint import load_checkpoint, pretrained_path
from codex_lab.data.corpus import load_corpus
from codex_lab.infer.syntax import function_prompts, syntax_validity


# what an absolute path looks like: POSIX root, home shorthand, or a Windows drive / UNC share
ABSOLUTE = re.compile(r"^(/|~|[A-Za-z]:[\\/]|\\\\)")


def portable_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """``meta`` without the build machine's absolute paths (they mean nothing elsewhere and
    leak its layout): the corpus root becomes a description, the run folder its last two parts
    (``runs/tiny``), and any other absolute path its file name."""
    stdlib = Path(sysconfig.get_paths()["stdlib"]).as_posix()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"

    def clean(key: str, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: clean(k, v) for k, v in value.items()}
        if isinstance(value, list):
            return [clean(key, v) for v in value]
        if not isinstance(value, str) or not ABSOLUTE.match(value):
            return value
        posix = value.replace("\\", "/").rstrip("/")
        if key == "root":
            if posix == stdlib:
                return f"the Python {version} standard library of the training interpreter (sysconfig 'stdlib')"
            return f"a folder named {Path(posix).name!r} (--corpus)"
        if key == "out":
            return "/".join(Path(posix).parts[-2:])
        return Path(posix).name

    return clean("", meta)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("checkpoint", help="checkpoint folder of a finished run")
    ap.add_argument("--prompts", type=int, default=64, help="function prompts for the syntax rate")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--command", default="codex-lab train --preset tiny --out runs/tiny",
                    help="the training command(s) that produced the checkpoint, stored in meta.json")
    ap.add_argument("--note", default="", help="free text stored in meta.json (e.g. how the run was interrupted)")
    args = ap.parse_args()
    ck = load_checkpoint(args.checkpoint)
    prompts = function_prompts(load_corpus().texts("val"), args.prompts)
    t0 = time.perf_counter()
    rep = syntax_validity(ck.model, ck.tokenizer, prompts, max_new_tokens=args.max_new_tokens)
    meta = dict(ck.meta)
    meta["command"] = f"{args.command} && python scripts/ship_checkpoint.py runs/tiny/checkpoint"
    meta["syntax_validity"] = round(rep.rate, 4)
    meta["syntax_validity_prompts"] = rep.n
    meta["syntax_validity_max_new_tokens"] = args.max_new_tokens
    meta["syntax_validity_time_s"] = round(time.perf_counter() - t0, 1)
    if args.note:
        meta["note"] = args.note
    dst = pretrained_path()
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(args.checkpoint, dst)
    (dst / "meta.json").write_text(json.dumps(portable_meta(meta), indent=2, sort_keys=True) + "\n")
    print(f"shipped {args.checkpoint} -> {dst}: val_loss {meta['val_loss']:.3f}, "
          f"syntax validity {rep.rate:.1%} of {rep.n}")


if __name__ == "__main__":
    main()
