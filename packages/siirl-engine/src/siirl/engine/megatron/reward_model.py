"""The reward model on megatron (``reward_model.strategy=megatron``, verl's key): the
sequence classifier of ``reward_model.model.path`` (transformers'
``*ForSequenceClassification`` of a decoder the bridge converts: Llama, Qwen2, Qwen3, MoE;
``builtin:tiny-reward`` is a ``LlamaForSequenceClassification``) as a megatron GPTModel in
the actor's parallel state (TP / PP as the critic), its decoder converted by the weight
bridge and its ``score`` head (``Linear(hidden, 1)``) kept beside the last stage, as the
critic's value head is. The score is the head's output at each row's last token, as the
fsdp reward model reads it (``siirl.engine.reward_model.engine``).

Rows: the reward node works where its parent's rows are, not necessarily in the megatron
layout, while the tensor- and pipeline-parallel peers of one model must score the same
rows; so each rank's rows are gathered over its model-parallel group, scored together,
and each rank keeps its own scores.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Mapping, Optional

import torch
import torch.distributed as dist

from siirl.data_coordinator.fields import ATTENTION_MASK, INPUT_IDS, POSITION_IDS, RESPONSES
from siirl.engine.common.backend import Head, engine_verb
from siirl.engine.common.config import run_seed, typed_config
from siirl.engine.common.runtime import resolve_device
from siirl.engine.megatron.backend import MegatronBackend
from siirl.engine.megatron.heads import MegatronBackbone
from siirl.engine.megatron.mixed_precision import params_dtype
from siirl.engine.megatron.moe import is_moe
from siirl.engine.megatron.offload import backend_offloader, role_offload
from siirl.engine.megatron.setup import build_megatron_model, init_megatron, sequence_parallel
from siirl.engine.megatron.transformer_overrides import transformer_overrides
from siirl.engine.reward_model import inputs
from siirl.engine.reward_model.engine import SCORE, RewardModelEngine
from siirl.engine.reward_model.factory import input_tokenizer
from siirl.engine.reward_model.loading import PATH_KEY, load_classifier
from siirl.errors import ConfigError


class ScoreModel(torch.nn.Module):
    """A megatron backbone (ids -> final hidden states ``[B, T, H]``) and the classifier's
    ``score`` head: one fp32 score per position ``[B, T]``."""

    def __init__(self, backbone: torch.nn.Module, score: torch.nn.Linear):
        super().__init__()
        self.backbone, self.score = backbone, score

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                position_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.backbone(input_ids, attention_mask, position_ids)
        return self.score(hidden.to(self.score.weight.dtype))[..., 0].float()


def score_head(model: ScoreModel) -> Head:
    """``rm_score [rows, 1]``: the score at the last column (each row's last token, the rows
    being left-padded); the stage module the schedule passes is the backbone's GPT."""

    def head(_stage: torch.nn.Module, micro: Any) -> Any:
        scores = model(micro[INPUT_IDS], micro[ATTENTION_MASK], micro[POSITION_IDS])
        return {SCORE: scores[:, -1:]}

    return Head(head, (SCORE,))


def as_causal_lm(classifier: torch.nn.Module) -> Any:
    """What the bridge reads of an HF causal LM (``config``, ``state_dict()``) for the
    classifier's decoder. Its LM head is never read (the score head replaces it): an untied
    one is loaded as zeros (a broadcast view: no copy)."""
    config = classifier.config
    prefix = f"{classifier.base_model_prefix}."
    state = {k: v for k, v in classifier.state_dict().items() if k.startswith(prefix)}
    if not getattr(config, "tie_word_embeddings", False):
        state["lm_head.weight"] = torch.zeros((), dtype=torch.float32).expand(
            config.vocab_size, config.hidden_size)
    return SimpleNamespace(config=config, state_dict=lambda: state)


class MegatronRewardModelEngine(RewardModelEngine):
    """The reward model engine over a :class:`MegatronBackend` of a :class:`ScoreModel`."""

    def __init__(self, cfg: Any, backend: MegatronBackend, tokenizer: Any,
                 input_tokenizer_: Optional[Any], model_parallel_group: Any):
        super().__init__(cfg, backend, tokenizer, input_tokenizer_)
        self.head = score_head(backend.module)
        self.group = model_parallel_group

    @engine_verb
    def scores(self, data: Any) -> torch.Tensor:
        """``[rows]`` scores of this rank's left-padded rows, scored with the model-parallel
        peers' rows (see the module docstring)."""
        rows = inputs.masked_rows(data[INPUT_IDS], data[ATTENTION_MASK])
        everyone = [rows]
        if self.group is not None:
            everyone = [None] * dist.get_world_size(self.group)
            dist.all_gather_object(everyone, rows, group=self.group)
        start = sum(len(r) for r in everyone[:dist.get_rank(self.group)]) \
            if self.group is not None else 0
        merged = inputs.left_padded([row for part in everyone for row in part], self.pad_id)
        # the backend sizes per-row outputs by the response width: the scored last token
        merged.set(RESPONSES, merged[INPUT_IDS][:, -1:])
        return super().scores(merged)[start:start + len(rows)]


def _score_linear(classifier: torch.nn.Module, path: str, device: torch.device
                  ) -> torch.nn.Linear:
    score = getattr(classifier, "score", None)
    if not isinstance(score, torch.nn.Linear) or score.out_features != 1:
        raise ConfigError(f"{PATH_KEY}={path!r}: reward_model.strategy=megatron needs a "
                          "sequence classifier with a one-output 'score' Linear head on a "
                          f"decoder the megatron bridge converts; {type(classifier).__name__} "
                          "has none: use reward_model.strategy=fsdp")
    return score.to(device)


def megatron_reward_model(config: Any, worker: Any = None,
                          peers: Optional[Mapping[str, Any]] = None
                          ) -> MegatronRewardModelEngine:
    """The engine of role ``reward_model`` under ``reward_model.strategy=megatron``."""
    from megatron.core import parallel_state as ps

    cfg = typed_config(config)
    if str(cfg.reward_model.style) != "discriminative":
        raise ConfigError(f"reward_model.style={cfg.reward_model.style!r} with "
                          "reward_model.strategy=megatron: only the sequence classifier "
                          "(style=discriminative) runs on megatron; the generative judge "
                          "replies through a rollout engine: set reward_model.strategy=fsdp")
    init_megatron(cfg, run_seed(cfg))  # the actor's parallel state
    device = resolve_device(cfg)
    classifier, tokenizer = load_classifier(cfg.reward_model.model, torch.device("cpu"))
    score = _score_linear(classifier, str(cfg.reward_model.model.path), device)
    try:
        causal_lm = as_causal_lm(classifier)
        overrides = transformer_overrides(
            cfg.reward_model.megatron.override_transformer_config, is_moe(causal_lm.config),
            "reward_model.megatron.override_transformer_config")
        gpt = build_megatron_model(causal_lm, device, sequence_parallel(cfg),
                                   params_dtype(cfg.reward_model.megatron.dtype,
                                                "reward_model.megatron.dtype"), None, overrides)
    except NotImplementedError as err:
        raise ConfigError(f"{PATH_KEY}: the megatron bridge cannot build this reward model "
                          f"({err}): use reward_model.strategy=fsdp") from None
    del classifier
    gpt.requires_grad_(False)
    gpt.eval()
    model = ScoreModel(MegatronBackbone(gpt), score)
    model.requires_grad_(False)
    dp = ps.get_data_parallel_world_size()
    offload = backend_offloader(role_offload(cfg.reward_model.megatron, "reward_model.megatron",
                                             device, trains=False), model, None, device)
    backend = MegatronBackend(model, schedule_model=gpt, dp_rank=ps.get_data_parallel_rank(),
                              dp_size=dp, dp_group=ps.get_data_parallel_group() if dp > 1
                              else None, offload=offload)
    group = ps.get_model_parallel_group() \
        if ps.get_tensor_model_parallel_world_size() * \
        ps.get_pipeline_model_parallel_world_size() > 1 else None
    return MegatronRewardModelEngine(cfg, backend, tokenizer, input_tokenizer(cfg, peers or {}),
                                     group)
