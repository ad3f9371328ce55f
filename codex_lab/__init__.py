"""codex_lab: the package the codex-lab lessons build, import and measure.

Public names are re-exported here; each lives in a small module of one concept.
"""

from .checkpoint import Checkpoint, load_checkpoint, load_pretrained, pretrained_path, save_checkpoint
from .config import ModelConfig
from .corpus import Corpus, SourceFile, load_corpus
from .data import fixed_batches, random_batch, tokenize_texts
from .cached_generate import generate_batch_cached, generate_ids_cached
from .engine import Engine, Finished, SamplingParams
from .exercises import generate_exercises, load_definitions, strip_solutions
from .generate import Generation, generate, generate_ids
from .gqa import (
    decode_tokens_per_s,
    group_size_experiment,
    kv_bytes_per_token,
    kv_cache_bytes,
    kv_saving,
    measured_cache_bytes,
    mean_pool_heads,
    mha_to_gqa,
    uptrain,
)
from .hf import from_hf, hf_config_to_codex, to_hf
from .hf_mixtral import (
    codex_config_from_mixtral,
    from_hf_mixtral,
    mixtral_config,
    moe_from_hf_block,
    moe_to_hf_block,
    to_hf_mixtral,
)
from .grading import check, grade_file, grade_folder
from .kv_cache import DynamicKVCache, PagedKVPool, RollingWindowCache, StaticKVCache, make_dynamic_caches, make_static_caches
from .model import (
    Attention,
    CodexModel,
    ModelOutput,
    RMSNorm,
    SwiGLU,
    apply_rope,
    attention_reference,
    attention_sdpa,
    register_attention_impl,
    rope_tables,
)
from .moe import (
    MoEFeedForward,
    Routing,
    RoutingStats,
    bias_update,
    capacity_keep_mask,
    dispatch_grouped,
    dispatch_reference,
    expert_capacity,
    ffn_param_counts,
    load_balancing_loss,
    moe_layers_of,
    route,
    router_z_loss,
    routing_stats,
    set_dispatch_impl,
)
from .attention_analysis import (
    attention_entropy,
    attention_maps,
    code_snippets,
    mass_by_distance,
    share_within,
    uniform_share_within,
)
from .canary import CanaryController, CanaryPolicy
from .gates import GateReport, gate_decision, run_gates
from .loadtest import LoadReport, malformed_storm, run_load
from .metrics import ServerMetrics
from .registry import ChecksumError, Registry
from .server import BackgroundServer, ModelServer, ServerConfig, create_app, serve_in_background
from .patterns import (
    AttentionPattern,
    BlockStrided,
    Fixed,
    GlobalTokens,
    LocalWindow,
    Strided,
    Union,
    causal_pairs,
    parse_pattern,
    seed_cost_ratio,
    union,
)
from .runtime import describe_environment, fast_mode, get_device, pick, seed_everything
from .sampling import sample_next, top_k_filter, top_p_filter
from .sparse import flex_available, sparse_attention, tiles_computed
from .speculative import SpecStats, expected_speedup, expected_tokens_per_round, speculative_generate, truncated_draft
from .syntax import cut_function, function_prompts, parses, syntax_validity
from .tokenizer import SPECIAL_TOKENS, TASK_TAGS, CodeTokenizer, train_tokenizer
from .train import PRESETS, TrainConfig, lr_at, preset_config, train

__version__ = "0.1.0"

__all__ = [
    "Attention", "AttentionPattern", "Checkpoint", "CodeTokenizer", "CodexModel", "Corpus",
    "DynamicKVCache", "Generation", "LocalWindow", "ModelConfig", "ModelOutput", "PRESETS",
    "RMSNorm", "SPECIAL_TOKENS", "SourceFile", "SwiGLU", "TASK_TAGS", "TrainConfig",
    "apply_rope", "attention_reference", "attention_sdpa", "check", "cut_function",
    "describe_environment", "fast_mode", "fixed_batches", "function_prompts", "generate",
    "generate_exercises", "generate_ids", "get_device", "grade_file", "grade_folder",
    "load_checkpoint", "load_corpus", "load_definitions", "load_pretrained", "lr_at",
    "make_dynamic_caches", "parse_pattern", "parses", "pick", "preset_config",
    "pretrained_path", "random_batch", "register_attention_impl", "rope_tables",
    "sample_next", "save_checkpoint", "seed_everything", "strip_solutions",
    "syntax_validity", "tokenize_texts", "top_k_filter", "top_p_filter", "train",
    "train_tokenizer",
    # lessons 01-02: attention patterns and sparse attention
    "BlockStrided", "Fixed", "GlobalTokens", "Strided", "Union", "attention_entropy",
    "attention_maps", "causal_pairs", "code_snippets", "flex_available", "mass_by_distance",
    "seed_cost_ratio", "share_within", "sparse_attention", "tiles_computed", "union",
    "uniform_share_within",
    # lesson 03: grouped-query attention and Hugging Face interop
    "decode_tokens_per_s", "from_hf", "group_size_experiment", "hf_config_to_codex",
    "kv_bytes_per_token", "kv_cache_bytes", "kv_saving", "measured_cache_bytes",
    "mean_pool_heads", "mha_to_gqa", "to_hf", "uptrain",
    # lesson 04: mixture of experts
    "MoEFeedForward", "Routing", "RoutingStats", "bias_update", "capacity_keep_mask",
    "codex_config_from_mixtral", "dispatch_grouped", "dispatch_reference", "expert_capacity",
    "ffn_param_counts", "from_hf_mixtral", "load_balancing_loss", "mixtral_config",
    "moe_from_hf_block", "moe_layers_of", "moe_to_hf_block", "route", "router_z_loss",
    "routing_stats", "set_dispatch_impl", "to_hf_mixtral",
    # lesson 07: serving, metrics, registry, gates, canary, load test
    "BackgroundServer", "CanaryController", "CanaryPolicy", "ChecksumError", "GateReport",
    "LoadReport", "ModelServer", "Registry", "ServerConfig", "ServerMetrics", "create_app",
    "gate_decision", "malformed_storm", "run_gates", "run_load", "serve_in_background",
    # lesson 06: fast inference
    "Engine", "Finished", "PagedKVPool", "RollingWindowCache", "SamplingParams", "SpecStats",
    "StaticKVCache", "expected_speedup", "expected_tokens_per_round", "generate_batch_cached",
    "generate_ids_cached", "make_static_caches", "speculative_generate", "truncated_draft",
]
