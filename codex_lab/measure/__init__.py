"""Measurement tooling, apart from what the lessons teach: llama.cpp as a peer (built from
source, decoding the same model exported to GGUF), profilers of where a decoded token's time
goes (operators under ``torch.profiler``; both engines under one sampling profiler) and the
single-stream study. Lessons and the report read its records; ``codex-lab bench inference``
runs it (see README.md in this folder)."""
