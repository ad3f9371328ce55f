"""Benchmarks on real problem sets (HumanEval), run with the course's engine and sandbox.

Layer: uses ``infer`` (generation), ``sandbox`` (execution) and ``data`` (tokenizer type)
only; never ``serve``, ``lessons`` or ``course``.
"""
