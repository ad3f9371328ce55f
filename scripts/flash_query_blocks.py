"""How fast PyTorch's fused CPU flash kernel runs per (query, key) pair, by query-block shape.

    python scripts/flash_query_blocks.py            # a table: shape, ms, ns per pair

The fast sparse kernel (``codex_lab/nn/sparse_fast.py``) computes a 128-token sliding window
as 64-row query units, each against 192 keys under a mask. This script times that call
against the alternatives that cover the same ~8k query rows with larger query blocks (the
kernel splits queries into 32-row tiles below 192 rows, 64 below 768, 256 above), which run
faster per pair but compute more masked pairs; and three unmasked shapes for reference.
Timed round-robin (``codex_lab.runtime.interleaved_times``), medians of 9 rounds, fp32,
4 batch-heads, head dim 64.
"""

from __future__ import annotations

import statistics

import torch

from codex_lab.runtime import interleaved_times

FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
HEADS, DIM = 4, 64


def call(q_len: int, k_len: int, blocks: int, masked: bool = True):  # noqa: ANN201
    """A flash call over ``blocks`` query blocks of ``q_len`` rows, each against ``k_len`` keys."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(HEADS, blocks, n, DIM, generator=g) for n in (q_len, k_len, k_len))  # (H, blocks, n, D)
    mask = torch.zeros(1, 1, q_len, k_len) if masked else None  # additive: a window's mask costs this much
    return lambda: FLASH(q, k, v, 0.0, False, attn_mask=mask, scale=DIM ** -0.5)


def main() -> None:
    torch.set_grad_enabled(False)
    # name -> (q rows, keys, blocks, masked); the masked ones cover ~8k query rows of a 128-token window
    shapes = {"window as 64-row units (the plan)": (64, 192, 126, True), "128-row blocks": (128, 256, 63, True),
              "192-row blocks": (192, 320, 42, True), "256-row blocks": (256, 384, 32, True),
              "768-row blocks": (768, 896, 11, True), "unmasked 64 x 192": (64, 192, 126, False),
              "unmasked 128 x 128": (128, 128, 126, False), "unmasked 256 x 512": (256, 512, 16, False)}
    fns = {name: call(*s) for name, s in shapes.items()}
    for f in fns.values():
        f()  # warm-up
    wall, _ = interleaved_times(fns, 9)
    print(f"{'shape':<36} {'ms':>7} {'ns/pair':>8}")
    for name, (ql, kl, nb, _) in shapes.items():
        ms = statistics.median(wall[name])
        # ns per pair = time / (heads * blocks * q rows * keys)
        print(f"{name:<36} {ms:7.2f} {ms * 1e6 / (HEADS * nb * ql * kl):8.2f}")


if __name__ == "__main__":
    main()
