"""Server metrics: vLLM-like names, SLO attainment read off histogram buckets, parsing."""

from __future__ import annotations

import math

import pytest

from codex_lab.serve.metrics import ITL_BUCKETS, TTFT_BUCKETS, ServerMetrics, histogram_attainment, parse_metrics


def test_observe_request_and_attainment():
    m = ServerMetrics("tiny")
    # TTFT 0.05 s and gaps 0.01, 0.03 s; then TTFT 0.2 s and one gap 0.015 s
    m.observe_request("v1", arrival=0.0, token_times=[0.05, 0.06, 0.09], prompt_tokens=7, finish_reason="length")
    m.observe_request("v1", arrival=1.0, token_times=[1.2, 1.215], prompt_tokens=3, finish_reason="stop")
    assert m.attainment("ttft", "v1", 0.1) == (0.5, 2)
    share, n = m.attainment("itl", "v1", 0.02)
    assert n == 3 and math.isclose(share, 2 / 3)
    with pytest.raises(ValueError, match="bucket edge"):
        m.attainment("ttft", "v1", 0.03)
    c = m.version_counts("v1")
    assert (c["n"], c["failures"], c["ttft_ok"], c["itl_ok"]) == (2, 0, 1, 2)
    m.error("internal", "v1")
    assert m.version_counts("v1")["failures"] == 1
    with pytest.raises(ValueError, match="unknown error kind"):
        m.error("oops")
    text = m.render().decode()
    fams = parse_metrics(text)
    assert sum(v for _, v in fams["codex_lab:prompt_tokens_total"]) == 10
    assert sum(v for _, v in fams["codex_lab:generation_tokens_total"]) == 5
    reasons = {lab["finished_reason"]: v for lab, v in fams["codex_lab:request_success_total"]}
    assert reasons == {"length": 1.0, "stop": 1.0}
    assert fams["codex_lab:peak_memory_bytes"][0][1] > 0


def test_bucket_edges_include_the_seed_targets():
    assert 0.1 in TTFT_BUCKETS and 0.02 in TTFT_BUCKETS and 0.02 in ITL_BUCKETS and 0.1 in ITL_BUCKETS


def test_histogram_attainment_from_parsed_buckets():
    m = ServerMetrics("tiny")
    for t in (0.01, 0.05, 0.09, 0.3):
        m.ttft.labels("tiny", "v1").observe(t)
    fams = parse_metrics(m.render().decode())
    buckets = [(float(lab["le"]), v) for lab, v in fams["codex_lab:time_to_first_token_seconds_bucket"]]
    assert histogram_attainment(buckets, 0.1) == 0.75
    assert histogram_attainment(buckets, 0.02) == 0.25
    with pytest.raises(ValueError, match="not a bucket edge"):
        histogram_attainment(buckets, 0.03)
    with pytest.raises(ValueError, match="Inf"):
        histogram_attainment(buckets[:-1], 0.1)


def test_gauges_from_engine_stats_and_versions():
    m = ServerMetrics("tiny")
    m.set_engine_stats("v1", {"running": 3, "waiting": 2, "kv_used_tokens": 256, "kv_capacity_tokens": 1024,
                              "kv_used_bytes": 4096})
    m.set_versions("v1", "v2")
    fams = parse_metrics(m.render().decode())
    assert fams["codex_lab:num_requests_running"][0][1] == 3
    assert fams["codex_lab:kv_cache_usage_perc"][0][1] == 0.25
    roles = {lab["role"]: lab["version"] for lab, _ in fams["codex_lab:model_version_info"]}
    assert roles == {"primary": "v1", "canary": "v2"}


def test_client_errors_never_count_against_a_version():
    """The canary reads a version's failures; a client's bad requests must not move them."""
    m = ServerMetrics("tiny")
    m.observe_request("v1", arrival=0.0, token_times=[0.01], prompt_tokens=1, finish_reason="stop")
    for kind in ("invalid_request", "unauthorized", "not_found", "too_large", "timeout", "rate_limited"):
        m.error(kind)  # refused before routing: version "-"
    assert m.version_counts("v1")["failures"] == 0
    m.error("internal", "v1")
    assert m.version_counts("v1")["failures"] == 1
    fams = parse_metrics(m.render().decode())
    kinds = {lab["kind"] for lab, _ in fams["codex_lab:request_errors_total"]}
    assert {"unauthorized", "timeout", "internal"} <= kinds
