"""Issue 39 item 3 check: the shipped model tuned in lesson 07's budget (40 steps of 8, lr 2e-3) on
codebench 2 iid, then greedy pass@1 on 16 iid test problems per family (gates.py says why the gate stays
on the first codebench).  python scripts/l05_gate_probe.py"""
import time, torch
torch.set_num_threads(1)
import codex_lab as cl
from codex_lab.evals import codebench2 as cb2
from codex_lab.lessons.l05_multitask.experiments import score_model, tune_shipped_on_codebench2
ck = cl.load_pretrained()
t = time.process_time()
m = tune_shipped_on_codebench2(ck.model, ck.tokenizer, steps=40, batch_size=8, lr=2e-3)
print("tune cpu", time.process_time() - t, flush=True)
probs = cb2.load_problems("iid", "all", n=16, seed=0)
sc = score_model(m, ck.tokenizer, probs, 128)
print({f: (sum(v), len(v)) for f, v in sc.items()}, "cpu", time.process_time() - t)
