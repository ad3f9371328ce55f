"""Stage 6 of the capstone: a temporary registry and a live canary (lessons 07 and 08)."""

from __future__ import annotations

from typing import Any

from codex_lab.nn.model import CodexModel


def canary_release(
    baseline: CodexModel,
    candidate: CodexModel,
    tokenizer: Any,
    registry_root: str,
    *,
    gates: dict[str, Any] | None = None,
    share: float = 0.3,
    min_requests: int = 5,
    promote_after: int = 10,
    requests: int = 40,
    max_tokens: int = 16,
    timeout_s: float = 120.0,
    serve_refused: bool = False,
) -> dict[str, Any]:
    """Register both models, serve the baseline, send ``share`` of live traffic to the candidate.

    The baseline becomes the registry's current version; the candidate is added with its
    gate results (``gates``) and served as a canary while 4 streaming clients send
    ``requests`` requests; the :class:`~codex_lab.serve.canary.CanaryController` promotes or rolls
    it back from the live metrics. Returns the decision, both windows, the client summary,
    the registry table and the versions.

    A candidate whose ``gates["passed"]`` is False gets no traffic (the seed's rule) unless
    ``serve_refused=True``, which exists only to show that the live canary check reaches its
    own verdict; the refusal stays recorded in the registry either way.
    """
    if gates is not None and gates.get("passed") is False and not serve_refused:
        raise ValueError("the candidate failed its release gates, so it gets no traffic; fix it and gate it again "
                         "(serve_refused=True only to demonstrate the live canary check)")
    from codex_lab.serve.canary import CanaryController, CanaryPolicy
    from codex_lab.serve.loadtest import run_load
    from codex_lab.serve.registry import Registry
    from codex_lab.serve.app import serve_in_background
    from codex_lab.serve.router import ModelServer, ServerConfig

    reg = Registry(registry_root)
    v_base = reg.add(baseline, tokenizer, note="capstone baseline: plain dense MHA, same training budget")
    reg.promote(v_base)
    v_cand = reg.add(candidate, tokenizer, gates=gates or {}, note="capstone candidate: sparse deep layers, GQA, MoE")
    server = ModelServer(tokenizer, ServerConfig(model_name="codex-lab-capstone", max_batch_size=8, max_waiting=64))
    server.add_version(v_base, reg.load(v_base).model)
    bg = serve_in_background(server)
    try:
        policy = CanaryPolicy(share=share, min_requests=min_requests, promote_after=promote_after)
        ctl = CanaryController(server, policy, registry=reg)
        ctl.start(v_cand, reg.load(v_cand).model)  # loaded back: its checksum is verified first
        ctl.watch(interval_s=0.2, timeout_s=timeout_s)
        # every answer runs to max_tokens (ignore_eos): a tiny model often ends after one token, and a
        # canary is never promoted on latency it did not observe (no gap between tokens, no TBT)
        load = run_load(bg.url, concurrency=4, requests=requests, max_tokens=max_tokens, duration_s=timeout_s,
                        extra_body={"ignore_eos": True})
        decision = ctl.join(timeout_s)
        if decision is None or decision.action == "wait":
            decision = ctl.step()  # one last look once the traffic has ended
        return {"baseline": v_base, "candidate": v_cand, "action": decision.action, "reasons": decision.reasons,
                "canary": decision.canary, "primary": decision.primary, "load": load.summary(),
                "serving": server.primary, "registry_current": reg.current(), "registry": reg.table()}
    finally:
        bg.stop()
        server.close()
