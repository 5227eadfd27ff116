"""Megatron's parallel state and this rank's model, from the run's typed config.

Parallel sizes come from ``actor_rollout_ref.actor.megatron`` (TP, PP, VPP, sequence
parallel); data parallelism takes the remaining workers; context parallelism is refused
(it needs Transformer Engine's attention). One parallel state per process: the reference
and the critic share the actor's sizes.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch

from siirl.engine.common.runtime import ensure_distributed
from siirl.engine.megatron.config import MegatronArguments, megatron_size_problems
from siirl.engine.megatron.rank_order import initialize_parallel_state
from siirl.errors import ConfigError
from siirl.params import SiiRLArguments

MEGATRON_KEY = "actor_rollout_ref.actor.megatron"


def parallel_sizes(mcfg: MegatronArguments) -> Dict[str, int]:
    return {"tensor_model_parallel_size": int(mcfg.tensor_model_parallel_size or 1),
            "pipeline_model_parallel_size": int(mcfg.pipeline_model_parallel_size or 1),
            "context_parallel_size": int(mcfg.context_parallel_size or 1),
            "virtual_pipeline_model_parallel_size":
                int(mcfg.virtual_pipeline_model_parallel_size or 1),
            "expert_model_parallel_size": int(mcfg.expert_model_parallel_size or 1),
            # null: the experts split like the dense layers (megatron's default)
            "expert_tensor_parallel_size": int(mcfg.expert_tensor_parallel_size
                                               or mcfg.tensor_model_parallel_size or 1)}


def sequence_parallel(cfg: SiiRLArguments) -> bool:
    """``megatron.sequence_parallel`` where it applies (it needs tensor parallelism)."""
    mcfg = cfg.actor_rollout_ref.actor.megatron
    return bool(mcfg.sequence_parallel) and parallel_sizes(mcfg)["tensor_model_parallel_size"] > 1



def init_megatron(cfg: SiiRLArguments, seed: int) -> None:
    """Initialise (once) megatron's parallel state for the run's sizes."""
    from megatron.core import parallel_state, tensor_parallel

    from siirl.engine.megatron.cpu_compat import enable_cpu_mode

    sizes = parallel_sizes(cfg.actor_rollout_ref.actor.megatron)
    tp, pp = sizes["tensor_model_parallel_size"], sizes["pipeline_model_parallel_size"]
    vpp = sizes["virtual_pipeline_model_parallel_size"]
    problems = megatron_size_problems(sizes["context_parallel_size"], pp, vpp)
    if problems:  # the validation pass refuses these first; here for engines built directly
        raise ConfigError(problems[0])
    enable_cpu_mode()
    ensure_distributed()
    import torch.distributed as dist

    if dist.get_world_size() % (tp * pp):
        raise ConfigError(f"{MEGATRON_KEY}.tensor_model_parallel_size={tp} x "
                          f"pipeline_model_parallel_size={pp} must divide the number of "
                          f"workers ({dist.get_world_size()})")
    ep = sizes["expert_model_parallel_size"]
    etp = sizes["expert_tensor_parallel_size"]
    # the experts' own layout: ETP x EP x expert-DP x PP = workers
    if dist.get_world_size() % (etp * ep * pp):
        raise ConfigError(f"{MEGATRON_KEY}.expert_tensor_parallel_size={etp} x "
                          f"expert_model_parallel_size={ep} x pipeline_model_parallel_size={pp}"
                          f" must divide the number of workers ({dist.get_world_size()})")
    if not parallel_state.model_parallel_is_initialized():
        # the TP x PP peers that read the same rows are consecutive workers (the planner's
        # megatron layout, dag_worker/walk/layouts.py), in megatron's pipeline-last layout
        initialize_parallel_state(tp, pp, vpp=vpp if vpp > 1 else None, ep=ep, etp=etp)
        tensor_parallel.model_parallel_cuda_manual_seed(seed)
    elif (parallel_state.get_tensor_model_parallel_world_size(),
          parallel_state.get_pipeline_model_parallel_world_size(),
          parallel_state.get_expert_model_parallel_world_size(),
          parallel_state.get_expert_tensor_parallel_world_size()) != (tp, pp, ep, etp):
        raise ConfigError(f"{MEGATRON_KEY}: TP {tp} x PP {pp} x EP {ep} x expert TP {etp} "
                          "differs from the sizes the actor's megatron state was built with")


def build_megatron_model(hf_model: torch.nn.Module, device: torch.device,
                         sequence_parallel: bool = False,
                         params_dtype: torch.dtype = torch.float32,
                         dist_checkpoint: Optional[Tuple[str, Optional[str]]] = None,
                         transformer_overrides: Optional[dict] = None) -> torch.nn.Module:
    """This rank's pipeline stage of ``hf_model`` as a GPTModel with its weights (with
    virtual pipeline stages: its chunks, as one ModelChunks module), its parameters and
    compute in ``params_dtype`` (the HF weights are rounded to it on loading). With
    ``dist_checkpoint`` = (role's megatron key, path) the weights come from that megatron
    distributed checkpoint instead (any layout; ``hf_model`` gives the architecture).
    ``transformer_overrides``: TransformerConfig keys set over the HF-derived ones
    (siirl.engine.megatron.transformer_overrides)."""
    from megatron.core import parallel_state as ps

    from siirl.engine.megatron.bridge import load_hf_weights
    from siirl.engine.megatron.chunks import ModelChunks
    from siirl.engine.megatron.model import build_gpt_model

    layers = int(hf_model.config.num_hidden_layers)
    pp = ps.get_pipeline_model_parallel_world_size()
    vpp = ps.get_virtual_pipeline_model_parallel_world_size() or 1
    if layers < pp:
        raise ConfigError(f"{MEGATRON_KEY}.pipeline_model_parallel_size={pp} exceeds the "
                          f"model's {layers} layers (each stage needs one)")
    if vpp == 1:
        model = build_gpt_model(hf_model.config, pre_process=ps.is_pipeline_first_stage(),
                                post_process=ps.is_pipeline_last_stage(),
                                sequence_parallel=sequence_parallel, params_dtype=params_dtype,
                                **(transformer_overrides or {}))
        if dist_checkpoint is None:
            load_hf_weights(model, hf_model.state_dict(), hf_model.config)
        else:
            _load_dist_checkpoint(model, hf_model.config, dist_checkpoint)
        return model.to(device)
    if layers % (pp * vpp):
        raise ConfigError(f"{MEGATRON_KEY}: pipeline_model_parallel_size={pp} x "
                          f"virtual_pipeline_model_parallel_size={vpp} must divide the model's "
                          f"{layers} layers")
    chunks = ModelChunks([
        build_gpt_model(hf_model.config,
                        pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=c),
                        post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=c),
                        vp_stage=c, sequence_parallel=sequence_parallel,
                        params_dtype=params_dtype, **(transformer_overrides or {}))
        for c in range(vpp)])
    if dist_checkpoint is not None:
        _load_dist_checkpoint(chunks, hf_model.config, dist_checkpoint)
        return chunks.to(device)
    for c, chunk in enumerate(chunks):
        stage, stages = chunks.virtual_stage(c)
        load_hf_weights(chunk, hf_model.state_dict(), hf_model.config, pp_rank=stage,
                        pp_size=stages)
    return chunks.to(device)


def _load_dist_checkpoint(model: torch.nn.Module, hf_config: Any,
                          dist_checkpoint: Tuple[str, Optional[str]]) -> None:
    from siirl.engine.megatron.chunks import model_chunks
    from siirl.engine.megatron.dist_checkpoint import load_model

    key, path = dist_checkpoint
    load_model(model, path, key)
    for chunk in model_chunks(model):  # what load_hf_weights records (logits' vocabulary)
        chunk.hf_vocab_size = hf_config.vocab_size
