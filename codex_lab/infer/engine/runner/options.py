"""What ``codex-lab serve``'s compiled step is given: its options (buckets from a short
completion, prompts as extra rows, a one-row shape for a request decoding alone), the bucket
sizes of a table, and the collector's freeze once the model and its graphs are loaded.
"""

from __future__ import annotations

import gc


def served_step_options(max_batch_size: int, *, mixed: bool = True) -> dict[str, int]:
    """The compiled step's options as ``codex-lab serve`` runs it (``Engine(step_options=...)``):
    arriving prompts ride as extra rows in a second shape of twice the batch's rows (``mixed``),
    and the smallest bucket holds a short completion (48 tokens, 3 blocks of 16) instead of 128,
    as every padded slot costs a gather and a dot product in every layer (a 16-row step took
    3.5 ms over 3 blocks and 4.4 ms over 8, alone on a quiet 2-core CPU, 2026-12-02), and a
    request decoding alone runs a one-row shape (``solo``: docs/PROFILE.md)."""
    return {"min_bucket_tokens": 48, "solo": True, **({"mixed_rows": 2 * max_batch_size} if mixed else {})}


def freeze_long_lived() -> int:
    """Collect garbage once, then ``gc.freeze()``: every object alive now (the model, torch and
    the compiler's ~550k objects after the buckets compile) moves to the collector's permanent
    generation, which later collections never scan. Without it a full collection in a serving
    process walks them all and stalls every stream at once: 390-560 ms measured (2026-12-02,
    quiet 2-core CPU), enough to push TTFT p95 at 8-16 streams past 500 ms. vLLM freezes the
    same way after capturing its graphs. Returns the number of frozen objects."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def bucket_sizes(min_blocks: int, max_blocks: int) -> tuple[int, ...]:
    """Every bucket, ascending: ``min_blocks`` times 1, 1.5, 2, 3, 4, 6, ... (1.5x only of an
    even count), then ``max_blocks``."""
    out, nb = [], min_blocks
    while nb < max_blocks:
        out.append(nb)
        if nb % 2 == 0 and nb * 3 // 2 < max_blocks:
            out.append(nb * 3 // 2)
        nb *= 2
    return tuple(out) + (max_blocks,)


__all__ = ["bucket_sizes", "freeze_long_lived", "served_step_options"]
