"""codex_lab: the package the codex-lab lessons build, import and measure.

Public names are re-exported here, each from the small module of one concept that defines
it. They load lazily (PEP 562): ``import codex_lab`` is fast, and ``codex_lab.Engine``
imports ``codex_lab.engine`` the first time it is used.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# module -> the public names it defines
_EXPORTS: dict[str, tuple[str, ...]] = {
    "attention_analysis": ('attention_entropy', 'attention_maps', 'code_snippets', 'mass_by_distance', 'share_within', 'uniform_share_within'),
    "cached_generate": ('generate_batch_cached', 'generate_ids_cached'),
    "capstone": ('CapstoneResult', 'CapstoneSizes', 'active_params', 'canary_release', 'capstone_claims', 'capstone_config', 'run_capstone'),
    "balancing": ('Balancer', 'STRATEGIES', 'make_balancer', 'task_stats', 'token_losses'),
    "canary": ('CanaryController', 'CanaryPolicy'),
    "checkpoint": ('Checkpoint', 'load_checkpoint', 'load_pretrained', 'pretrained_path', 'save_checkpoint'),
    "config": ('ModelConfig',),
    "corpus": ('Corpus', 'SourceFile', 'load_corpus'),
    "data": ('fixed_batches', 'random_batch', 'tokenize_texts'),
    "engine": ('Engine', 'Finished', 'SamplingParams'),
    "exercises": ('generate_exercises', 'load_definitions', 'strip_solutions'),
    "finetune": ('FinetuneConfig', 'FinetuneResult'),
    "gates": ('GateReport', 'gate_decision', 'run_gates'),
    "generate": ('Generation', 'generate', 'generate_ids'),
    "gqa": ('decode_tokens_per_s', 'group_size_experiment', 'kv_bytes_per_token', 'kv_cache_bytes', 'kv_saving', 'mean_pool_heads', 'measured_cache_bytes', 'mha_to_gqa', 'uptrain'),
    "grading": ('check', 'grade_file', 'grade_folder'),
    "hf": ('from_hf', 'hf_config_to_codex', 'to_hf'),
    "hf_mixtral": ('codex_config_from_mixtral', 'from_hf_mixtral', 'mixtral_config', 'moe_from_hf_block', 'moe_to_hf_block', 'to_hf_mixtral'),
    "kv_cache": ('DynamicKVCache', 'PagedKVPool', 'RollingWindowCache', 'StaticKVCache', 'make_dynamic_caches', 'make_static_caches'),
    "loadtest": ('LoadReport', 'malformed_storm', 'run_load'),
    "metrics": ('ServerMetrics',),
    "model": ('Attention', 'CodexModel', 'ModelOutput', 'RMSNorm', 'SwiGLU', 'apply_rope', 'attention_reference', 'attention_sdpa', 'register_attention_impl', 'rope_tables'),
    "mt_eval": ('evaluate_generation', 'task_losses'),
    "moe": ('MoEFeedForward', 'Routing', 'RoutingStats', 'bias_update', 'capacity_keep_mask', 'dispatch_grouped', 'dispatch_reference', 'expert_capacity', 'ffn_param_counts', 'load_balancing_loss', 'moe_layers_of', 'route', 'router_z_loss', 'routing_stats', 'set_dispatch_impl'),
    "patterns": ('AttentionPattern', 'BlockStrided', 'Fixed', 'GlobalTokens', 'LocalWindow', 'Strided', 'Union', 'causal_pairs', 'parse_pattern', 'seed_cost_ratio', 'union'),
    "registry": ('ChecksumError', 'Registry'),
    "runtime": ('describe_environment', 'fast_mode', 'get_device', 'pick', 'seed_everything'),
    "sampling": ('sample_next', 'top_k_filter', 'top_p_filter'),
    "server": ('BackgroundServer', 'ModelServer', 'ServerConfig', 'create_app', 'serve_in_background'),
    "sparse": ('flex_available', 'sparse_attention', 'tiles_computed'),
    "speculative": ('SpecStats', 'expected_speedup', 'expected_tokens_per_round', 'speculative_generate', 'truncated_draft'),
    "syntax": ('cut_function', 'function_prompts', 'parses', 'syntax_validity'),
    "tasks": ('TASKS', 'TaskExample', 'TaskSet', 'build_tasks', 'collate', 'task_files'),
    "tokenizer": ('CodeTokenizer', 'SPECIAL_TOKENS', 'TASK_TAGS', 'train_tokenizer'),
    "train": ('PRESETS', 'TrainConfig', 'lr_at', 'preset_config', 'train'),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'codex_lab' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # cache: the next access skips this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


# A public name that is also a module name binds eagerly: importing the submodule later
# (anything that does `from .generate import ...`) would otherwise shadow a lazy name with
# the module. The finetune loop stays reachable as codex_lab.finetune.finetune.
from .generate import generate  # noqa: E402
from .train import train  # noqa: E402
