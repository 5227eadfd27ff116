"""``RewardModelEngine``: role ``reward_model`` with a sequence classifier, on any backend
whose ``forward_backward_batch`` runs forward-only passes (``siirl.engine.fsdp``; megatron's
subclass with its own head: ``siirl.engine.megatron.reward_model``).

``compute_rm_score(batch)`` scores each row's prompt and response (``inputs``) in
micro-batches of ``reward_model.micro_batch_size_per_gpu`` rows (all rows at once when
unset), or of at most ``reward_model.forward_max_token_len_per_gpu`` tokens with
``reward_model.use_dynamic_bsz``; no gradients. The score is the model's output at each
row's last token (its ``score`` head applied to every position, read at the end; a model
without such a head gives its own pooled output), written as ``rm_scores`` ``[B, R]`` on the
row's last response token for the reward manager to add to the rule scores.
"""

from __future__ import annotations

import time
from typing import Any, Dict, Optional

import torch

from siirl.dag_worker.data_structures import NodeOutput
from siirl.data_coordinator.fields import ATTENTION_MASK, INPUT_IDS, POSITION_IDS
from siirl.engine.common.backend import Head
from siirl.engine.common.dynamic_batch import check_backend, token_plan
from siirl.engine.common.update_settings import budget
from siirl.engine.reward_model import inputs
from siirl.engine.reward_model.combine import RM_SCORES, place_on_last_token, score_metrics
from siirl.engine.reward_model.loading import same_tokenizer
from siirl.params import SiiRLArguments

SCORE = "rm_score"  # the head's output: one number per row


def last_token_scores(module: torch.nn.Module, input_ids: torch.Tensor,
                      attention_mask: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    """``[rows]``: the classifier's output at the last column (each row's last token, the
    rows being left-padded). The ``score`` head's per-position output is caught on its way
    to the model's own pooling, which finds the last token by the pad id and so misses an
    EOS that is also the pad token."""
    caught: Dict[str, torch.Tensor] = {}
    head = getattr(module, "score", None)
    hook = None
    if isinstance(head, torch.nn.Module):
        hook = head.register_forward_hook(lambda _m, _i, out: caught.setdefault("logits", out))
    try:
        out = module(input_ids=input_ids, attention_mask=attention_mask,
                     position_ids=position_ids, use_cache=False)
    finally:
        if hook is not None:
            hook.remove()
    logits = caught.get("logits")
    if logits is not None and logits.dim() == 3 and logits.shape[1] == input_ids.shape[1]:
        return logits[:, -1, 0]
    return out.logits.reshape(input_ids.shape[0], -1)[:, 0]


def _head(module: torch.nn.Module, micro: Any) -> Dict[str, torch.Tensor]:
    return {SCORE: last_token_scores(module, micro[INPUT_IDS], micro[ATTENTION_MASK],
                                     micro[POSITION_IDS])}


HEAD = Head(_head, (SCORE,))


class RewardModelEngine:
    """``backend`` holds the frozen classifier; ``tokenizer`` is its own, ``input_tokenizer``
    the one of the batch's ids (the actor's): the ids are reused when they agree."""

    def __init__(self, cfg: SiiRLArguments, backend: Any, tokenizer: Any,
                 input_tokenizer: Optional[Any] = None):
        rm = cfg.reward_model
        self.backend = backend
        self.rm_tokenizer = tokenizer
        self.input_tokenizer = input_tokenizer if input_tokenizer is not None else tokenizer
        self.retokenize = not same_tokenizer(self.input_tokenizer, tokenizer)
        self.micro_rows = rm.micro_batch_size_per_gpu
        self.max_length = rm.max_length
        self.limit = budget(rm.use_dynamic_bsz, rm.forward_max_token_len_per_gpu,
                            "reward_model.forward_max_token_len_per_gpu")
        check_backend(backend, self.limit)
        self.pad_id = int(getattr(tokenizer, "pad_token_id", None) or 0)
        self.head = HEAD  # a backend's own (megatron's: siirl.engine.megatron.reward_model)

    def model_inputs(self, batch: Any) -> Any:
        """The reward model's left-padded ids of each row (see ``inputs``)."""
        if self.retokenize:
            rows = inputs.retokenized_rows(batch, self.input_tokenizer, self.rm_tokenizer)
        else:
            rows = inputs.actor_rows(batch)
        return inputs.left_padded(inputs.truncate(rows, self.max_length), self.pad_id)

    def scores(self, data: Any) -> torch.Tensor:
        """``[rows]`` scores of a left-padded batch, micro-batch by micro-batch."""
        rows = data.batch_size[0]
        if rows == 0:
            return torch.zeros(0)
        backend = self.backend
        if self.limit is not None:
            micro: Any = token_plan(data, self.limit, backend.dp_group, backend.dp_size)
        else:
            micro = int(self.micro_rows or rows)
        with torch.no_grad():
            out = backend.forward_backward_batch(data, micro, self.head, forward_only=True)
        return out[SCORE].reshape(rows)

    def compute_rm_score(self, batch: Any) -> NodeOutput:
        start = time.perf_counter()
        scores = self.scores(self.model_inputs(batch))
        batch.set(RM_SCORES, place_on_last_token(scores, inputs.response_mask(batch)))
        metrics = score_metrics(scores)
        metrics["timing_s/reward_model"] = time.perf_counter() - start
        return NodeOutput(batch=batch, metrics=metrics)
