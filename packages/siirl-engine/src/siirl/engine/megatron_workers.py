"""The ``megatron`` engine plugin (entry point ``siirl.engines: megatron``): actor,
reference and critic on megatron-core's GPTModel, from the ``siirl-engine[megatron]`` extra.

Importing this module imports megatron-core, so without the extra the plugin registry
reports ``pip install "siirl-engine[megatron]"`` at start-up.

What runs here: the HF checkpoint (or the built-in model) is loaded with transformers and
converted by the weight bridge into this rank's GPTModel stage (or virtual-pipeline chunks;
Transformer Engine layer spec when TE is importable, the local spec otherwise). Forward and
backward run through megatron's pipeline schedule (``megatron.ppo_actor`` /
``megatron.ppo_critic``); the actor steps megatron's DDP + distributed optimizer. After
each update the HF copy that the ``hf`` rollout generates with is refreshed through the
bridge in size-bounded buckets, from every pipeline stage.

Parallel sizes come from ``actor_rollout_ref.actor.megatron`` (TP, PP, VPP, sequence
parallel); data parallelism takes the remaining workers; context parallelism is refused at
start-up (it needs Transformer Engine's attention). docs/megatron.md has the details.
"""

from __future__ import annotations

import copy
import functools
import logging
import socket
from typing import Any, Dict, Optional

import megatron.core  # noqa: F401  (fails here, cleanly, without the [megatron] extra)
import torch

from siirl.dag_worker.data_structures import NodeOutput
from siirl.engine.critic.engine import CriticEngine
from siirl.engine.fsdp_workers import (
    ACTOR,
    REF,
    ROLLOUT,
    ActorEngine,
    ReferenceEngine,
    _device,
    _seed,
)
from siirl.engine.megatron.checkpointing import MegatronCheckpointed
from siirl.engine.megatron.ppo_actor import MegatronPPOActor
from siirl.engine.megatron.ppo_critic import MegatronPPOCritic
from siirl.errors import ConfigError
from siirl.execution.config_select import select

_PARALLEL_KEYS = ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                  "context_parallel_size", "virtual_pipeline_model_parallel_size")
SYNC_BUCKET_BYTES = 64 << 20
logger = logging.getLogger(__name__)


def parallel_sizes(config: Any, prefix: str) -> Dict[str, int]:
    return {key: int(select(config, f"{prefix}.megatron.{key}", 1) or 1)
            for key in _PARALLEL_KEYS}


def _ensure_distributed() -> None:
    """megatron's parallel state needs torch.distributed: a gloo world of one when this
    worker runs alone (multi-worker jobs are initialised by the launcher)."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1)


# Ranks ordered TP fastest, then PP, then DP, so the TP x PP peers that read the same rows
# are consecutive workers: the planner's megatron layout (dag_worker/layouts.py) groups
# consecutive ranks. (megatron's default puts PP outermost: tp-cp-ep-dp-pp.)
RANK_ORDER = "tp-cp-ep-pp-dp"


def _init_megatron(config: Any, prefix: str) -> None:
    from megatron.core import parallel_state, tensor_parallel

    from siirl.engine.megatron.cpu_compat import enable_cpu_mode

    sizes = parallel_sizes(config, prefix)
    tp, pp = sizes["tensor_model_parallel_size"], sizes["pipeline_model_parallel_size"]
    vpp = sizes["virtual_pipeline_model_parallel_size"]
    if vpp > 1 and pp == 1:
        raise ConfigError(f"{prefix}.megatron.virtual_pipeline_model_parallel_size={vpp} needs "
                          "pipeline_model_parallel_size > 1")
    if sizes["context_parallel_size"] != 1:
        raise ConfigError(
            f"{prefix}.megatron.context_parallel_size={sizes['context_parallel_size']}: "
            "context parallelism is not supported by this release (it needs Transformer "
            "Engine's attention); use tensor and pipeline parallelism")
    enable_cpu_mode()
    _ensure_distributed()
    import torch.distributed as dist

    if dist.get_world_size() % (tp * pp):
        raise ConfigError(f"{prefix}.megatron.tensor_model_parallel_size={tp} x "
                          f"pipeline_model_parallel_size={pp} must divide the number of "
                          f"workers ({dist.get_world_size()})")
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(
            tp, pp, virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
            order=RANK_ORDER)
        tensor_parallel.model_parallel_cuda_manual_seed(_seed(config))
    elif (parallel_state.get_tensor_model_parallel_world_size(),
          parallel_state.get_pipeline_model_parallel_world_size()) != (tp, pp):
        raise ConfigError(f"{prefix}.megatron: TP {tp} x PP {pp} differs from the sizes the "
                          "actor's megatron state was built with")


def build_megatron_model(hf_model: torch.nn.Module, device: torch.device,
                         sequence_parallel: bool = False) -> torch.nn.Module:
    """This rank's pipeline stage of ``hf_model`` as a GPTModel with its weights (with
    virtual pipeline stages: its chunks, as one ModelChunks module)."""
    from megatron.core import parallel_state as ps

    from siirl.engine.megatron.bridge import load_hf_weights
    from siirl.engine.megatron.chunks import ModelChunks
    from siirl.engine.megatron.model import build_gpt_model

    layers = int(hf_model.config.num_hidden_layers)
    pp = ps.get_pipeline_model_parallel_world_size()
    vpp = ps.get_virtual_pipeline_model_parallel_world_size() or 1
    key = "actor_rollout_ref.actor.megatron"
    if layers < pp:
        raise ConfigError(f"{key}.pipeline_model_parallel_size={pp} exceeds the model's "
                          f"{layers} layers (each stage needs one)")
    if vpp == 1:
        model = build_gpt_model(hf_model.config, pre_process=ps.is_pipeline_first_stage(),
                                post_process=ps.is_pipeline_last_stage(),
                                sequence_parallel=sequence_parallel)
        load_hf_weights(model, hf_model.state_dict(), hf_model.config)
        return model.to(device)
    if layers % (pp * vpp):
        raise ConfigError(f"{key}: pipeline_model_parallel_size={pp} x "
                          f"virtual_pipeline_model_parallel_size={vpp} must divide the model's "
                          f"{layers} layers")
    chunks = ModelChunks([
        build_gpt_model(hf_model.config,
                        pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=c),
                        post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=c),
                        vp_stage=c, sequence_parallel=sequence_parallel)
        for c in range(vpp)])
    for c, chunk in enumerate(chunks):
        stage, stages = chunks.virtual_stage(c)
        load_hf_weights(chunk, hf_model.state_dict(), hf_model.config, pp_rank=stage,
                        pp_size=stages)
    return chunks.to(device)


def megatron_logprobs(model, input_ids, attention_mask, position_ids, response_length,
                      temperature=1.0, calculate_entropy=False):
    """``response_logprobs`` computed with megatron's forward (same alignment and math)."""
    from siirl.engine.megatron.model import forward_logits
    from siirl.engine.models.logprob import logprobs_from_logits

    logits = forward_logits(model, input_ids, position_ids, attention_mask)
    return logprobs_from_logits(logits, input_ids, int(response_length), temperature,
                                calculate_entropy)


def sequence_parallel(config: Any) -> bool:
    """``megatron.sequence_parallel`` where it applies (it needs tensor parallelism)."""
    return (bool(select(config, f"{ACTOR}.megatron.sequence_parallel", False))
            and parallel_sizes(config, ACTOR)["tensor_model_parallel_size"] > 1)


def _grad_averager(module: torch.nn.Module, group: Any, world_size: int, tp_group: Any = None):
    """Gradient sync after the backward: sequence-parallel norm weights summed over TP,
    then everything averaged over data parallelism."""
    from siirl.engine.megatron.sequence_parallel import sum_sequence_parallel_grads

    if world_size <= 1 and tp_group is None:
        return None

    def average() -> None:
        sum_sequence_parallel_grads(module, tp_group)
        if world_size <= 1:
            return
        for param in module.parameters():
            if param.grad is not None:
                torch.distributed.all_reduce(param.grad, group=group)
                param.grad.div_(world_size)
    return average


class MegatronActorEngine(MegatronCheckpointed, ActorEngine):
    """The fsdp actor's interface (log-probs, updates, checkpoints, HF export) with the
    policy as a megatron GPTModel; ``module`` stays the HF model the rollout uses."""

    def __init__(self, config: Any, worker: Any = None):
        from megatron.core import parallel_state

        from siirl.engine.fsdp_workers import _load_model
        from siirl.engine.optim import build_lr_scheduler

        _init_megatron(config, ACTOR)
        self.config, self.worker = config, worker
        # data parallelism is what remains of the workers after tensor parallelism
        self.rank = parallel_state.get_data_parallel_rank()
        self.world_size = parallel_state.get_data_parallel_world_size()
        self.tp_size = parallel_state.get_tensor_model_parallel_world_size()
        self.tp_group = parallel_state.get_tensor_model_parallel_group() \
            if self.tp_size > 1 else None
        device = _device(config)
        hf_model, self.tokenizer = _load_model(config)
        self.module = hf_model.to(device)
        self.megatron_model = build_megatron_model(hf_model, device, sequence_parallel(config))
        self.group = parallel_state.get_data_parallel_group() if self.world_size > 1 else None
        self.sharded = False  # no FSDP: megatron shards by tensor parallelism only
        self.initial_module = copy.deepcopy(hf_model) if self.world_size > 1 else None
        self.pristine = True
        self._optim_cfg = select(config, f"{ACTOR}.optim")
        optimizer, grad_sync = self._build_optimizer(config)
        try:
            scheduler = build_lr_scheduler(optimizer, self._optim_cfg,
                                           select(config, "trainer.total_training_steps", -1)
                                           or -1)
        except ConfigError:
            scheduler = None
        self.actor = MegatronPPOActor(
            self.megatron_model, select(config, ACTOR), select(config, f"{ROLLOUT}.temperature",
                                                               1.0),
            optimizer=optimizer, lr_scheduler=scheduler,
            rollout_n=select(config, f"{ROLLOUT}.n", 1), world_size=self.world_size,
            seed=_seed(config), group=self.group,
            log_prob_micro_batch_size=select(config,
                                             f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu"),
            grad_sync=grad_sync, tp_group=self.tp_group)

    def _build_optimizer(self, config: Any):
        """(optimizer, grad sync): megatron's DDP + distributed optimizer (or its plain one
        with ``use_distributed_optimizer=false``); with virtual pipeline chunks torch AdamW
        and an all-reduce (megatron's DDP wraps one chunk per instance: not wired yet)."""
        from megatron.core import parallel_state

        from siirl.engine.megatron.optimizer_adapter import MegatronOptimizer
        from siirl.engine.optim import build_optimizer

        if (parallel_state.get_virtual_pipeline_model_parallel_world_size() or 1) == 1:
            use_dist = bool(select(config, f"{ACTOR}.megatron.use_distributed_optimizer", True))
            return MegatronOptimizer(self.megatron_model, self._optim_cfg,
                                     select(config, f"{ACTOR}.grad_clip", 1.0), use_dist), None
        logger.warning("virtual pipeline stages: the actor uses torch AdamW with gradients "
                       "all-reduced over data parallelism, not megatron's distributed optimizer")
        return (build_optimizer(self.megatron_model.parameters(), self._optim_cfg),
                _grad_averager(self.megatron_model, self.group, self.world_size, self.tp_group))

    def update_policy(self, batch: Any) -> NodeOutput:
        out = super().update_policy(batch)
        self.sync_rollout_weights()
        return out

    @torch.no_grad()
    def sync_rollout_weights(self) -> None:
        """Copy the megatron weights (every pipeline stage's) into the HF module, bucket by
        bucket."""
        from siirl.engine.megatron.weight_sync import iter_pipeline_hf_weights

        params = dict(self.module.named_parameters())
        params.update(dict(self.module.named_buffers()))
        for bucket in iter_pipeline_hf_weights(self.megatron_model, self.module.config,
                                               SYNC_BUCKET_BYTES, tp_group=self.tp_group,
                                               stages=self.actor.stages):
            for name, tensor in bucket:
                if name in params:
                    params[name].copy_(tensor)

    def after_load(self) -> None:
        self.sync_rollout_weights()


class MegatronReferenceEngine(ReferenceEngine):
    """Frozen initial policy as a megatron GPTModel; ``compute_ref_log_prob`` (and the
    skip when nothing reads it) is the fsdp reference's."""

    def __init__(self, config: Any, worker: Any = None):  # no super(): nothing to shard
        from siirl.engine.fsdp_workers import _load_model, reference_needed

        self.config, self.enabled = config, reference_needed(config)
        self.actor = None
        if not self.enabled:
            return
        from megatron.core import parallel_state

        # one megatron parallel state per process: the reference shares the actor's sizes
        _init_megatron(config, ACTOR)
        hf_model = ReferenceEngine._initial_module(config, worker) if worker is not None \
            else _load_model(config)[0]
        model = build_megatron_model(hf_model, _device(config), sequence_parallel(config))
        model.requires_grad_(False)
        model.eval()
        micro = (select(config, f"{REF}.log_prob_micro_batch_size_per_gpu")
                 or select(config, f"{ACTOR}.ppo_micro_batch_size_per_gpu"))
        self.actor = MegatronPPOActor(
            model, select(config, REF), select(config, f"{ROLLOUT}.temperature", 1.0),
            world_size=parallel_state.get_data_parallel_world_size(),
            log_prob_micro_batch_size=micro)


class MegatronBackbone(torch.nn.Module):
    """A GPTModel as a value-model backbone: token ids -> final hidden states ``[B, T, H]``
    (after the final norm; read off the decoder, the LM head's logits are not used)."""

    def __init__(self, gpt: torch.nn.Module):
        from siirl.engine.megatron.chunks import model_chunks

        super().__init__()
        self.gpt = gpt  # all of this rank's chunks: the critic's optimizer trains them all
        self._last = model_chunks(gpt)[-1]  # the chunk whose decoder ends the model
        self._hidden = None
        self._last.decoder.register_forward_hook(self._keep)

    def _keep(self, module, inputs, output) -> None:
        self._hidden = output

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False):
        from siirl.engine.megatron.model import forward_logits
        from siirl.engine.megatron.sequence_parallel import gather_sequence

        forward_logits(self._last, input_ids, position_ids, attention_mask)
        hidden, self._hidden = gather_sequence(self._hidden, self._last.config), None
        return hidden.transpose(0, 1)  # megatron's [S, B, H] -> [B, S, H]


class MegatronCriticEngine(MegatronCheckpointed, CriticEngine):
    """PPO critic: the fsdp critic's value head (same seeded init) on a megatron GPTModel
    built from ``critic.model``, with the actor's tensor/data-parallel layout."""

    def __init__(self, config: Any, worker: Any = None):
        from megatron.core import parallel_state

        from siirl.engine.critic.value_model import ValueModel
        from siirl.engine.models.loader import load_model_and_tokenizer

        _init_megatron(config, ACTOR)
        lm, _ = load_model_and_tokenizer(select(config, "critic.model"), dtype=torch.float32)
        self.megatron_model = build_megatron_model(lm, _device(config), sequence_parallel(config))
        module = ValueModel(MegatronBackbone(self.megatron_model), lm.config.hidden_size,
                            seed=_seed(config))
        dp = parallel_state.get_data_parallel_world_size()
        group = parallel_state.get_data_parallel_group() if dp > 1 else None
        tp_group = parallel_state.get_tensor_model_parallel_group() \
            if parallel_state.get_tensor_model_parallel_world_size() > 1 else None
        super().__init__(config, worker, module=module,
                         parallel=(parallel_state.get_data_parallel_rank(), dp, group),
                         critic_cls=functools.partial(MegatronPPOCritic,
                                                      stage=self.megatron_model),
                         grad_sync=_grad_averager(module, group, dp, tp_group), tp_group=tp_group)

    def replicated_modules(self) -> Dict[str, torch.nn.Module]:
        return {"value_head": self.module.value_head}


_ROLES = {"actor": MegatronActorEngine, "reference": MegatronReferenceEngine,
          "critic": MegatronCriticEngine}


def megatron_engine(role: str, config: Any, worker: Optional[Any] = None) -> Any:
    """Entry point ``siirl.engines: megatron``."""
    if role not in _ROLES:
        raise ConfigError(f"the megatron engine serves roles {', '.join(sorted(_ROLES))}, "
                          f"not {role!r}")
    return _ROLES[role](config, worker)
