"""Copy a finished `codex-lab train --preset tiny` run into codex_lab/assets/tiny and record
its syntax-validity rate and the command that regenerates it in meta.json. Absolute paths of
the build machine (corpus root, run folder) are replaced by descriptions (``portable_meta``).

    codex-lab train --preset tiny --out runs/tiny                          # 600 steps
    codex-lab train --preset tiny --out runs/tiny --steps 1200 --resume    # 600 more
    python scripts/ship_checkpoint.py runs/tiny/checkpoint --prompts 32 \
        --command "codex-lab train --preset tiny --out runs/tiny && codex-lab train --preset tiny --out runs/tiny --steps 1200 --resume"

Shipping also re-records tests/fixtures/greedy_tiny.json (the shipped model's greedy tokens on
the fixture's prompts, which tests/test_greedy_fixture.py pins); ``--record-greedy-only``
re-records it from the checkpoint already shipped, without copying anything.
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


GREEDY_FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "greedy_tiny.json"

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


def record_greedy_fixture(folder: Path, fixture: Path = GREEDY_FIXTURE, note: str = "") -> None:
    """Re-record ``fixture`` with the greedy tokens of the checkpoint in ``folder`` on the
    fixture's own prompts and ``max_new_tokens`` (the cases tests/test_greedy_fixture.py checks)."""
    import torch

    from codex_lab.infer.generate import generate_ids

    ck = load_checkpoint(folder)
    old = json.loads(fixture.read_text())
    cases = []
    for case in old["cases"]:
        prompt_ids = ck.tokenizer.encode(case["prompt"])
        with torch.no_grad():
            ids, reason = generate_ids(ck.model.eval(), prompt_ids, max_new_tokens=old["max_new_tokens"], temperature=0.0)
        cases.append({"prompt": case["prompt"], "prompt_ids": prompt_ids, "new_ids": ids, "finish_reason": reason})
    head = {"model": "codex_lab/assets/tiny", "max_new_tokens": old["max_new_tokens"],
            "note": note or old["note"]}
    # one case per line, as the file was first written: a re-recording shows as a small diff
    body = ",\n".join("  " + json.dumps(c) for c in cases)
    fixture.write_text(json.dumps(head)[:-1] + ',\n "cases": [\n' + body + "\n ]}\n")
    print(f"re-recorded {fixture} ({len(cases)} prompts, {old['max_new_tokens']} greedy tokens each)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("checkpoint", help="checkpoint folder of a finished run")
    ap.add_argument("--prompts", type=int, default=64, help="function prompts for the syntax rate")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--command", default="codex-lab train --preset tiny --out runs/tiny",
                    help="the training command(s) that produced the checkpoint, stored in meta.json")
    ap.add_argument("--note", default="", help="free text stored in meta.json (e.g. how the run was interrupted)")
    ap.add_argument("--record-greedy-only", action="store_true",
                    help="only re-record tests/fixtures/greedy_tiny.json from the shipped checkpoint")
    args = ap.parse_args()
    if args.record_greedy_only:
        record_greedy_fixture(pretrained_path())
        return
    ck = load_checkpoint(args.checkpoint)
    prompts = function_prompts(load_corpus().texts("val"), args.prompts)
    t0 = time.perf_counter()
    rep = syntax_validity(ck.model, ck.tokenizer, prompts, max_new_tokens=args.max_new_tokens)
    meta = dict(ck.meta)
    src = args.checkpoint if not ABSOLUTE.match(args.checkpoint) else "/".join(Path(args.checkpoint).parts[-3:])
    meta["command"] = f"{args.command} && python scripts/ship_checkpoint.py {src}"
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
    record_greedy_fixture(dst, note=f"greedy tokens of the shipped model, re-recorded by scripts/ship_checkpoint.py "
                                    f"when it shipped {meta['command'].split(' && ')[0]!r}; any change of behaviour shows here")


if __name__ == "__main__":
    main()
