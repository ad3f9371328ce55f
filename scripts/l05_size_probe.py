"""Lesson 05 sizing probe: a small model trained from scratch on a codebench 2 split's five families
(pooled, or one family with fams=...), its held-out loss curve, CPU seconds per step, and greedy pass@1
on 48 test problems per family. Used to choose protocol_setup's standard sizes and MIN_CHANGE:

    python scripts/l05_size_probe.py steps=2000 d=64 L=2 V=1024 bs=16 lr=3e-3
    python scripts/l05_size_probe.py steps=400 d=64 L=2 V=1024 bs=16 lr=3e-3 fams=completion
"""
import sys, time, json, torch, statistics
torch.set_num_threads(1)
from codex_lab.evals import codebench2 as cb2
from codex_lab.evals import codebench_run as cr
from codex_lab.training.finetune import FinetuneConfig, finetune
from codex_lab.data.tokenizer import train_tokenizer
from codex_lab.nn.config import ModelConfig
from codex_lab.nn.model import CodexModel
a = dict(x.split("=") for x in sys.argv[1:])
steps = int(a.get("steps", 600)); bs = int(a.get("bs", 16)); lr = float(a.get("lr", 3e-3))
d = int(a.get("d", 64)); L = int(a.get("L", 2)); V = int(a.get("V", 512)); ML = int(a.get("ml", 256))
split = a.get("split", "iid"); bal = a.get("bal", "token"); mix = a.get("mix", "size")
fams = tuple(a.get("fams", ",".join(cb2.FAMILIES)).split(","))
t0 = time.process_time()
ts = cb2.training_tasks(split, "all", n_per_family=(int(a["npf"]) if "npf" in a else None), examples=False)
texts = [e.prompt + e.answer for dd in ts.examples.values() for e in dd["train"]]
tok = train_tokenizer(texts, vocab_size=V)
print("tok cpu", round(time.process_time() - t0, 1), "vocab", tok.vocab_size)
for f, dd in ts.examples.items():
    n = sorted(len(tok.encode(e.prompt)) + len(tok.encode(e.answer)) + 3 for e in dd["train"])
    print(f, len(dd["train"]), "p50", n[len(n)//2], "p95", n[int(len(n)*.95)], "max", n[-1])
torch.manual_seed(int(a.get("seed", 0)))
m = CodexModel(ModelConfig(vocab_size=tok.vocab_size, d_model=d, n_layer=L, n_head=4, max_seq_len=ML))
print("params", sum(p.numel() for p in m.parameters()))
cfg = FinetuneConfig(tasks=fams, balance=bal, mix=mix, steps=steps, batch_size=bs, lr=lr, warmup=20,
                     max_len=ML, eval_every=max(1, steps // 12), val_per_task=48, seed=int(a.get("seed", 0)))
t1 = time.process_time()
r = finetune(m, tok, ts, cfg, progress=False)
tt = time.process_time() - t1
print("train cpu s", round(tt, 1), "per step", round(tt / steps, 4), flush=True)
for e in r.evals:
    print(int(e["step"]), " ".join(f"{f[:4]}={e['val_'+f]:.3f}" for f in fams))
t2 = time.process_time()
probs = cb2.load_problems(split, fams, n=int(a.get("n", 48)), seed=0, examples=False)
comps = cr.complete(m, tok, probs, max_new_tokens=int(a.get("mnt", 96)))
res = cb2.execute(probs, comps)
by = {}
for p, rr in zip(probs, res):
    by.setdefault(p.family, []).append(rr[0].passed)
print("eval cpu s", round(time.process_time() - t2, 1), {f: round(sum(v) / len(v), 3) for f, v in by.items()}, flush=True)
