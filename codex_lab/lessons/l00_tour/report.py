"""Report section for lesson 00: environment, corpus, model size, the shipped checkpoint's
training curve, sample generations and their syntax-validity rate."""

from __future__ import annotations

from typing import Any

TITLE = "00 Foundation: corpus, tokenizer, the shipped model"
ORDER = 0


def run(ctx: Any) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pick = ctx.pick  # sizes for the run's mode
    from codex_lab.infer.syntax import function_prompts
    from codex_lab.data.tokenizer import tokenizer_summary

    corpus = ctx.corpus()
    ck = ctx.checkpoint()
    st = corpus.stats()
    lines = ["### Corpus", "", f"Root: `{st['root']}`", "", "| split | files | characters | lines |", "|---|---|---|---|"]
    for split in ("train", "val"):
        lines.append(f"| {split} | {st[split + '_files']:,} | {st[split + '_chars']:,} | {st[split + '_lines']:,} |")
    lines += ["", f"Skipped: {st['skipped_undecodable']} undecodable, {st['skipped_duplicates']} duplicate files.", ""]

    tsum = tokenizer_summary(ck.tokenizer, corpus.texts("val")[: pick(20, 200)])
    m = ck.model
    lines += ["### Tokenizer and model", "",
              f"- byte-level BPE, vocabulary {tsum['vocab_size']:,}: {tsum['chars_per_token']:.2f} characters per token on validation files",
              f"- {ck.config.n_layer} layers, d_model {ck.config.d_model}, {ck.config.n_head} heads ({ck.config.n_kv_head} KV), "
              f"{m.num_params():,} parameters ({m.num_params(non_embedding=True):,} without the embedding)",
              f"- shipped checkpoint: validation loss {ck.meta['val_loss']:.3f} nats/token at step {ck.meta['step']}, "
              f"trained {ck.meta['train_time_s'] / 60:.1f} min on {ck.meta.get('device', '?')}; recorded syntax validity "
              f"{ck.meta.get('syntax_validity', float('nan')):.0%} over {ck.meta.get('syntax_validity_prompts', '?')} prompts",
              f"- regenerate: `{ck.meta.get('command', 'codex-lab train --preset tiny')}`", ""]

    hist = ck.meta["history"]
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot([h["step"] for h in hist], [h["train_loss"] for h in hist], label="train")
    ax.plot([h["step"] for h in hist], [h["val_loss"] for h in hist], label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.legend()
    lines += [ctx.savefig(fig, "l00_training_curve"), ""]

    from codex_lab.lessons.l00_tour.experiments import syntax_rate

    prompts = function_prompts(corpus.texts("val"), pick(40, 200))
    rate = syntax_rate(ck.model, ck.tokenizer, prompts, max_new_tokens=pick(48, 96))
    lines += ["### Samples", "", f"{rate.share.describe()} of generated functions parse in this run (greedy, "
              f"Wilson 95% interval): {rate.verdict()}.", ""]
    for prompt, body, ok in rate.samples[:3]:
        lines += ["```python", (prompt + body).rstrip(), "```", f"parses: {ok}", ""]
    return "\n".join(lines)
