"""Report section for lesson 03: grouped-query attention (KV bytes measured, conversion, uptraining)."""

from __future__ import annotations

from typing import Any

import torch

TITLE = "Lesson 03: grouped-query attention"
ORDER = 3

# Published shapes of two real code models (their Hugging Face config.json files).
REAL_MODELS = {
    "Qwen2.5-Coder-0.5B": dict(vocab_size=151936, d_model=896, n_layer=24, n_head=14, n_kv_head=2, max_seq_len=32768),
    "Qwen2.5-Coder-7B": dict(vocab_size=152064, d_model=3584, n_layer=28, n_head=28, n_kv_head=4, max_seq_len=32768),
}


def run(ctx: Any) -> str:
    """Measure KV-cache bytes against the formula for g = 1..8, turn real models' head
    counts into bytes at 32k context, and convert + uptrain the shipped model."""
    import matplotlib.pyplot as plt

    from codex_lab.stats import VERDICT_RULE

    from codex_lab.lessons.l03_gqa import experiments as gqa
    from codex_lab.nn.config import ModelConfig
    from codex_lab.data.batches import fixed_batches, tokenize_texts
    from codex_lab.nn.model import CodexModel

    threads = torch.get_num_threads()
    # the math threads are the report's (course.report runs each section under
    # runtime.use_compute_threads: 1 on a 2-core machine), as in the lesson
    try:
        ck = ctx.checkpoint()
        mha = ck.model.eval()
        seq = 256 if ctx.fast else 1024
        # bytes: the shipped model (4 heads) and the same width with 8 heads (to reach g = 8)
        eight = CodexModel(ModelConfig.from_dict({**ck.config.to_dict(), "n_head": 8, "n_kv_head": 8})).eval()
        byte_rows = []
        for base in (mha, eight):
            ref = gqa.measured_cache_bytes(base, 1, seq)
            for g in [g for g in (1, 2, 4, 8) if base.cfg.n_head % g == 0]:
                m = gqa.mha_to_gqa(base, base.cfg.n_head // g)
                measured = gqa.measured_cache_bytes(m, 1, seq)
                formula = gqa.kv_cache_bytes(m.cfg, 1, seq)
                byte_rows.append((base.cfg.n_head, g, m.cfg.n_kv_head, formula, measured, 1 - measured / ref))
        assert all(f == m for _, _, _, f, m, _ in byte_rows), "measured cache bytes differ from the formula"
        saving = {g: s for h, g, _, _, _, s in byte_rows if h == 8}

        # quality: convert the shipped model to g = 1, 2, 4 (4 = MQA) and uptrain each equally
        corpus = ctx.corpus()
        files = corpus.files[:80] if ctx.fast else corpus.files
        train_tokens = tokenize_texts(ck.tokenizer, [f.text for f in files if f.split == "train"])
        val_texts = [f.text for f in files if f.split == "val"] or [corpus.val[0].text]
        val_batches = fixed_batches(tokenize_texts(ck.tokenizer, val_texts), 8, 128 if ctx.fast else 256, 2 if ctx.fast else 16)
        steps = 4 if ctx.fast else 100
        seeds = [0, 1, 2] if ctx.fast else [0, 1, 2, 3, 4]  # uptraining seeds: data order of the extra steps
        runs = [gqa.group_size_experiment(
            mha, train_tokens, val_batches, group_sizes=(1, 2, 4), steps=steps, batch_size=8,
            seq_len=128 if ctx.fast else 256, lr=3e-4, decode_batch=4 if ctx.fast else 16,
            decode_prompt=64 if ctx.fast else 512, decode_tokens=8 if ctx.fast else 64,
            seed=seed, measure_decode=seed == seeds[0],
        ) for seed in seeds]
        rows = runs[0]
        verdicts = gqa.group_size_verdicts(runs)
    finally:
        torch.set_num_threads(threads)

    out = [
        "KV-cache bytes = 2 x layers x KV heads x head_dim x tokens x batch x bytes per element; "
        f"measured on the `DynamicKVCache` tensors after a cached forward of {seq} tokens (float32):",
        "",
        "| query heads | g | KV heads | formula (bytes) | measured (bytes) | saving vs MHA | 1 - 1/g |",
        "|---|---|---|---|---|---|---|",
    ]
    out += [f"| {h} | {g} | {kv} | {f:,} | {m:,} | {s:.1%} | {1 - 1 / g:.1%} |" for h, g, kv, f, m, s in byte_rows]
    out += ["", "Real code models, one 32,768-token sequence in bfloat16:", "",
            "| model | query / KV heads | KV cache (GQA) | same shapes as MHA | saving |", "|---|---|---|---|---|"]
    for name, shape in REAL_MODELS.items():
        cfg = ModelConfig(**shape)
        b = gqa.kv_cache_bytes(cfg, 1, 32768, torch.bfloat16)
        b_mha = gqa.kv_cache_bytes(ModelConfig(**{**shape, "n_kv_head": shape["n_head"]}), 1, 32768, torch.bfloat16)
        out.append(f"| {name} | {cfg.n_head} / {cfg.n_kv_head} | {b / 2**30:.3f} GiB | {b_mha / 2**30:.2f} GiB | {1 - b / b_mha:.1%} |")

    out += ["", f"The shipped model (4 heads, MHA) converted by mean-pooling K/V heads (Ainslie et al. 2023), "
            f"then uptrained {steps} steps each (g = 1 is the control, trained equally long); seed {seeds[0]} of "
            f"{len(seeds)}:", "",
            "| g | KV heads | val loss after pooling | val loss after uptraining | KV bytes/token | decode tok/s (CPU) |",
            "|---|---|---|---|---|---|"]
    out += [f"| {r['g']} | {r['n_kv_head']} | {r['val_loss_converted']:.3f} | {r['val_loss_uptrained']:.3f} | "
            f"{r['kv_bytes_per_token']:,} | {r['decode_tok_s']:.0f} |" for r in rows]

    out += ["", f"Quality after uptraining over {len(seeds)} uptraining seeds (paired; {VERDICT_RULE}):", ""]
    out += [f"- g = {g}: {c.describe()}" for g, c in verdicts.items()]

    fig, ax = plt.subplots(figsize=(5, 3))
    gs = sorted(saving)
    ax.bar([str(g) for g in gs], [100 * saving[g] for g in gs], label="measured saving")
    ax.axhline(40, color="C3", ls="--", label='seed: "about 40%"')
    ax.set_xlabel("group size g")
    ax.set_ylabel("KV-cache saving (%)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=8)
    out += ["", ctx.savefig(fig, "l03_kv_saving")]

    ctx.claim('GQA with group size 4-8 "reduces KV-cache memory by about 40%"',
              f"KV bytes measured on cache tensors: -{saving[4]:.1%} at g=4, -{saving[8]:.1%} at g=8 "
              "(exactly 1 - 1/g; 40% would need g = 1.67)",
              "holds with a correction", lesson="03")
    cost = rows[-1]["val_loss_converted"] - rows[0]["val_loss_converted"]
    mqa = verdicts[max(verdicts)]
    ctx.claim("recommended group size 4-8 (quality kept)",
              f"shipped 4-head model as MQA (g=4): +{cost:.3f} nats/token right after mean-pooling; after {steps} "
              f"uptraining steps vs MHA trained equally long, difference {mqa.diff:+.3f} nats/token "
              f"(95% CI [{mqa.lo:+.3f}, {mqa.hi:+.3f}], {mqa.n_a} seeds, paired); no statement about large models",
              mqa.verdict, lesson="03")
    return "\n".join(out)
