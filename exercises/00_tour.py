# ---
# jupyter:
#   jupytext:
#     cell_metadata_filter: -all
#     formats: ipynb,py:percent
#     notebook_metadata_filter: kernelspec,jupytext
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.7
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# GENERATED from solutions/ by `codex-lab exercises generate`: do not edit by hand.

# %% [markdown]
# # Lesson 00 exercises: the warm-ups
#
# Write each function between the markers, then run the `check(...)` cell below it.
# `check` runs the *public* checks and prints `passed`, `not yet done` or the failure.
# Cells that use your function run only once its check passes; until then they say so.
# Grade the whole file from a terminal with `codex-lab grade exercises/00_tour.py`.
#
# **Run time:** fast mode on CPU: ~5 s; on one GPU: not yet measured.

# %%
import sys

if "google.colab" in sys.modules:  # Colab only: install the course (torch/numpy untouched)
    import subprocess

    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "git+https://github.com/codex-lab/codex-lab@main"], check=True)

# %%
import math

from codex_lab import check, load_pretrained, seed_everything

seed_everything(0)
tok = load_pretrained().tokenizer


# %% [markdown]
# ## Exercise 1: characters per token
# A tokenizer's compression is the number of characters it covers per token, pooled over
# all texts: `sum(len(text)) / sum(len(tokens))`. Return it as a float.

# %%
def chars_per_token(tokenizer, texts):
    """Total characters of ``texts`` divided by their total number of tokens (float)."""
    raise NotImplementedError("exercise chars_per_token: not yet done")


# %%
import inspect
import json.decoder

if check(chars_per_token).status == "passed":
    sample = inspect.getsource(json.decoder)
    print(f"characters per token on json/decoder.py: {chars_per_token(tok, [sample]):.2f}")
else:
    print("skipped: this cell needs chars_per_token (write it above)")


# %% [markdown]
# ## Exercise 2: where a generated function ends
# The lesson's syntax check generates a body after a function's signature, then cuts it where
# the function ends before parsing. The rule: the text up to the completion's first newline
# continues the prompt's last line and is always kept; after it, keep every line until the
# first **non-blank line that starts at column 0** (a new `def`, `class`, decorator or
# statement: the function is over). Blank lines and lines indented by spaces or tabs stay.
# Return the kept text exactly, newlines included.

# %%
def cut_at_function_end(completion):
    """The completion up to (not including) the first non-blank line at column 0 after its first line."""
    raise NotImplementedError("exercise cut_at_function_end: not yet done")


# %%
if check(cut_at_function_end).status == "passed":
    sample = "\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\ndef main():\n    pass\n"
    print("def fib(n):" + cut_at_function_end(sample))
else:
    print("skipped: this cell needs cut_at_function_end (write it above)")

# %% [markdown]
# ## Exercise 3 (derive it): bits per character, to compare models across tokenizers
# A language model's loss is in **nats per token**, but two tokenizers cut the same text into
# different numbers of tokens, so two models' losses are not comparable as they stand. Papers
# compare them in **bits per character** (or per byte): the information the model needs to
# encode each character of the text. From a loss of `loss` nats/token and a tokenizer that
# covers `chars_per_token` characters per token (exercise 1), derive it. Return a float.
#
# Hints: how many nats per character is that? And how many bits is one nat?

# %%
def bits_per_char(loss, chars_per_token):
    """loss (nats/token), chars_per_token (characters/token) -> bits per character (float)."""
    raise NotImplementedError("exercise bits_per_char: not yet done")


# %%
if check(bits_per_char).status == "passed":
    loss = load_pretrained().meta["val_loss"]  # the shipped model's held-out loss, nats/token
    for r in (2.5, 3.5):
        print(f"loss {loss:.3f} nats/token at {r} characters/token = {bits_per_char(loss, r):.3f} bits/character")
    print("the same bits per character, from a tokenizer covering 4 characters per token, needs a loss of",
          f"{bits_per_char(loss, 3.5) * math.log(2) * 4:.3f} nats/token: a lower loss is not a better model by itself")
else:
    print("skipped: this cell needs bits_per_char (write it above)")
