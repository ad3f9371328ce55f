"""The training entry point under torchrun with 2 CPU ranks (gloo): ranks stay in sync."""

import json
import os
import subprocess
import sys
from pathlib import Path


def test_torchrun_two_ranks_stay_in_sync(tmp_path: Path):
    out = tmp_path / "ddp"
    env = {**os.environ, "CODEX_LAB_FAST": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "codex_lab.cli", "train", "--preset", "tiny", "--out", str(out), "--steps", "6",
           "--eval-every", "3", "--max-files", "15", "--no-progress"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((out / f"ddp_rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["step"] == ranks[1]["step"] == 6
    # identical parameters on both ranks after 6 all-reduced steps (bitwise: same init,
    # same averaged gradients, same optimizer arithmetic)
    assert ranks[0]["checksum"] == ranks[1]["checksum"]
    meta = json.loads((out / "checkpoint" / "meta.json").read_text())
    assert meta["world_size"] == 2
