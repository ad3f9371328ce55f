"""codex_lab: the package the codex-lab lessons build, import and measure.

Public names are re-exported here, each from the small module of one concept that defines
it. They load lazily (PEP 562): ``import codex_lab`` is fast, and ``codex_lab.Engine``
imports ``codex_lab.infer.engine.loop`` the first time it is used.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# module -> the public names it defines
_EXPORTS: dict[str, tuple[str, ...]] = {
    "lessons.l01_attention_patterns.analysis": ('attention_entropy', 'attention_maps', 'code_snippets', 'mass_by_distance', 'share_within', 'uniform_share_within'),
    "lessons.l08_capstone.pipeline": ('CapstoneResult', 'CapstoneSizes', 'run_capstone'),
    "lessons.l08_capstone.architecture": ('capstone_config',),
    "lessons.l08_capstone.release": ('canary_release',),
    "lessons.l08_capstone.claims": ('capstone_claims',),
    "training.balancing": ('Balancer', 'STRATEGIES', 'make_balancer', 'task_stats', 'token_losses'),
    "serve.canary": ('CanaryController', 'CanaryPolicy'),
    "training.checkpoint": ('Checkpoint', 'load_checkpoint', 'load_codebench2_tuned', 'load_pretrained', 'pretrained_path', 'save_checkpoint'),
    "nn.config": ('ModelConfig',),
    "data.corpus": ('Corpus', 'SourceFile', 'load_corpus'),
    "data.batches": ('fixed_batches', 'random_batch', 'tokenize_texts'),
    "data.longrange": ('RecallBatch', 'RecallTask', 'RecallVocab', 'filler_lines', 'make_recall_batch', 'recall_vocab', 'window_baseline', 'window_reach'),
    "data.fim": ('fim_prompt_ids', 'fim_token_stream', 'fim_transform'),
    "infer.engine.loop": ('Engine',),
    "infer.engine.scheduler": ('Finished',),
    "course.exercises": ('generate_exercises', 'load_definitions', 'strip_solutions'),
    "training.finetune": ('FinetuneConfig', 'FinetuneResult'),
    "serve.gates": ('GateReport', 'SUITE', 'bench_problems', 'engine_completer', 'functional_score', 'gate_decision', 'run_gates'),
    "infer.generate": ('Generation', 'generate', 'generate_batch_cached', 'generate_ids', 'generate_ids_cached'),
    "lessons.l03_gqa.experiments": ('group_size_experiment',),
    "lessons.l03_gqa.bench": ('decode_tokens_per_s',),
    "course.grading": ('check', 'grade_file', 'grade_folder'),
    "hf.llama": ('from_hf', 'hf_config_to_codex', 'to_hf'),
    "hf.folder": ('HFCheckpoint', 'HFTokenizer', 'load_hf_folder'),
    "evals.humaneval": ('load_problems', 'pass_at_k'),
    "evals.codebench2.dsl": ('Primitive', 'Program', 'Step'),
    "evals.codebench2.oracle": ('Mutant',),
    "evals.codebench2.audit": ('Audit', 'normalise'),
    "evals.codebench2.scoring": ('bootstrap_interval', 'seed_problem_interval'),
    "hf.mixtral": ('codex_config_from_mixtral', 'from_hf_mixtral', 'mixtral_config', 'moe_from_hf_block', 'moe_to_hf_block', 'to_hf_mixtral'),
    "nn.kv_cache": ('DynamicKVCache', 'PagedKVPool', 'RollingWindowCache', 'StaticKVCache', 'make_dynamic_caches', 'make_static_caches'),
    "serve.loadtest": ('LoadReport', 'malformed_storm', 'run_load'),
    "serve.metrics": ('ServerMetrics', 'histogram_attainment', 'parse_metrics'),
    "nn.model": ('Attention', 'CodexModel', 'ModelOutput'),
    "nn.layers": ('RMSNorm', 'SwiGLU', 'apply_rope', 'rope_tables'),
    "nn.int8": ('Int8Linear', 'quantize_int8'),
    "nn.attention": ('attention_reference', 'attention_sdpa', 'one_query_attention', 'register_attention_impl'),
    "training.evaluate": ('task_losses', 'val_loss'),
    "infer.task_metrics": ('evaluate_generation',),
    "nn.moe": ('MoEFeedForward', 'Routing', 'RoutingStats', 'bias_update', 'capacity_keep_mask', 'expert_capacity', 'ffn_param_counts', 'load_balancing_loss', 'moe_layers_of', 'route', 'router_z_loss', 'routing_stats', 'set_dispatch_impl'),
    "nn.moe_dispatch": ('dispatch_grouped', 'dispatch_reference'),
    "nn.patterns": ('AttentionPattern', 'BlockStrided', 'Fixed', 'GlobalTokens', 'LocalWindow', 'MoBA', 'Strided', 'Union', 'causal_pairs', 'parse_pattern', 'seed_cost_ratio', 'union'),
    "nn.moba": ('moba_attention', 'moba_density', 'moba_mask', 'moba_select', 'moba_top_k_for_density'),
    "serve.registry_files": ('ChecksumError',),
    "serve.registry": ('Registry',),
    "stats": ('Comparison', 'DID_NOT_LEARN', 'FAILS_AS_STATED', 'MIN_SEEDS', 'NONINFERIORITY_RULE', 'NO_VERDICT', 'UNDER_TRAINED', 'VERDICTS', 'VERDICT_RULE', 'check_stated', 'compare', 'holm', 'judge_trained', 'noninferiority', 'verdict_from_interval'),
    "stats.proportion": ('Proportion', 'wilson_interval'),
    "stats.speedup": ('TimingRatio', 'timing_ratio'),
    "training_state": ('TrainingState', 'all_trained', 'held_floor', 'states_text', 'threshold_for', 'training_state'),
    "parallel": ('Remote', 'call_all', 'cpu_seconds', 'run_units', 'unit_workers'),
    "runtime": ('describe_environment', 'expected_seconds', 'get_device', 'lesson_header', 'seed_everything'),
    "runtime.mode": ('MODES', 'Mode', 'resolve_mode'),
    "runtime.timing": ('interleaved_times', 'median_ms'),
    "runtime.threads": ('compute_threads', 'use_compute_threads'),
    "sandbox": ('SandboxResult', 'SandboxUnavailable', 'isolation_mode', 'run_python'),
    "infer.sampling": ('SamplingParams', 'apply_penalties', 'sample_next', 'token_logprobs', 'top_k_filter', 'top_p_filter'),
    "hf.export": ('export_hf_folder',),
    "hf.gguf_export": ('export_gguf',),
    "serve.app": ('BackgroundServer', 'create_app', 'serve_in_background'),
    "serve.router": ('ModelServer', 'ServerConfig'),
    "nn.sparse": ('flex_available', 'sparse_attention', 'tiles_computed'),
    "nn.sparse_native": ('native_status',),
    "nn.moe_native": ('moe_native_status',),
    "infer.speculative": ('SpecStats', 'expected_speedup', 'expected_tokens_per_round', 'speculative_generate'),
    "infer.prompt_lookup": ('draft_length', 'lookup_draft', 'prompt_lookup_generate', 'verify_costs', 'verify_sizes'),
    "lessons.l06_inference.draft": ('load_draft',),
    "infer.fast_decode": ('FastDecoder',),
    "infer.aot_step": ('AotStep', 'DirectRunner', 'aot_package', 'aot_step'),
    "infer.engine.runner.aot_paged": ('paged_aot_step',),
    "evals.quantized": ('int8_fidelity',),
    "infer.engine.runner.compiled": ('CompiledPagedStep',),
    "infer.engine.runner.options": ('served_step_options',),
    "infer.engine.runner.mixed": ('mixed_step',),
    "nn.surgery": ('mean_pool_heads', 'mha_to_gqa', 'truncated_draft'),
    "nn.accounting": ('active_params', 'kv_bytes_per_token', 'kv_cache_bytes', 'kv_saving', 'measured_cache_bytes'),
    "training.loop": ('LoopConfig', 'run_loop'),
    "infer.syntax": ('cut_function', 'function_prompts', 'parses', 'syntax_validity'),
    "data.tasks": ('TASKS', 'TaskSet', 'build_tasks', 'task_files'),
    "data.functions": ('TaskExample',),
    "data.task_batches": ('collate',),
    "data.tokenizer": ('CodeTokenizer', 'SPECIAL_TOKENS', 'TASK_TAGS', 'train_tokenizer'),
    "training.pretrain": ('PRESETS', 'TrainConfig', 'lr_at', 'preset_config', 'train', 'uptrain'),
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
# the module. The finetune loop stays reachable as codex_lab.training.finetune.finetune.
from codex_lab.infer.generate import generate  # noqa: E402
from codex_lab.training.pretrain import train  # noqa: E402
from codex_lab.training_state import training_state  # noqa: E402  (the module has the function's name)
