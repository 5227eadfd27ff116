"""What the megatron actor, reference and critic compute on the last pipeline stage:
log-prob heads over the GPT stage's logits, value heads over a value model whose backbone
is the GPT stage (:class:`MegatronBackbone`)."""

from __future__ import annotations

from typing import Any, Callable, Dict

import torch

from siirl.data_coordinator.fields import ATTENTION_MASK, INPUT_IDS, POSITION_IDS
from siirl.engine.common.backend import Head
from siirl.engine.critic.value_model import response_values
from siirl.engine.megatron.chunks import model_chunks
from siirl.engine.megatron.model import forward_logits
from siirl.engine.megatron.packing import (
    PACKED,
    SEGMENTS,
    block_causal_mask,
    packed_logprobs,
)
from siirl.engine.megatron.pipeline import logprob_head
from siirl.engine.megatron.sequence_parallel import gather_sequence
from siirl.engine.models.logprob import logprobs_from_logits
from siirl.engine.models.packing import unpack


def logprob_heads(response_length: int, temperature: float, calculate_entropy: bool) -> Head:
    """Log-probs of a padded micro-batch, or of a packed one (``megatron.packing``)."""
    names = ("log_probs", "entropy") if calculate_entropy else ("log_probs",)
    padded = logprob_head(response_length, temperature, calculate_entropy)

    def head(module: torch.nn.Module, batch: Dict[str, Any]) -> Dict[str, Any]:
        if PACKED in batch:
            return packed_logprobs(module, batch, temperature, calculate_entropy)
        return padded(module, batch)

    return Head(head, names)


def value_heads(value_model: torch.nn.Module) -> Callable[[int], Head]:
    """Heads giving ``values [B, R]`` of ``value_model`` (its backbone is the scheduled
    GPT stage, so the stage module the schedule passes is not needed)."""

    def heads(response_length: int) -> Head:
        def head(_stage: torch.nn.Module, batch: Dict[str, torch.Tensor]) -> Dict[str, Any]:
            if PACKED in batch:  # one packed row: megatron's block-diagonal mask goes as is
                packed = batch[PACKED]
                values = value_model(input_ids=batch[INPUT_IDS],
                                     attention_mask=block_causal_mask(batch[SEGMENTS]),
                                     position_ids=batch[POSITION_IDS])
                return {"values": unpack(values[0, packed.sources], packed)}
            return {"values": response_values(value_model, batch[INPUT_IDS],
                                              batch[ATTENTION_MASK], batch[POSITION_IDS],
                                              response_length)}

        return Head(head, ("values",))

    return heads


def megatron_logprobs(model, input_ids, attention_mask, position_ids, response_length,
                      temperature=1.0, calculate_entropy=False):
    """``response_logprobs`` computed with megatron's forward (same alignment and math)."""
    logits = forward_logits(model, input_ids, position_ids, attention_mask)
    return logprobs_from_logits(logits, input_ids, int(response_length), temperature,
                                calculate_entropy)


class MegatronBackbone(torch.nn.Module):
    """A GPTModel as a value-model backbone: token ids -> final hidden states ``[B, T, H]``
    (after the final norm; read off the decoder, the LM head's logits are not used)."""

    def __init__(self, gpt: torch.nn.Module):
        super().__init__()
        self.gpt = gpt  # all of this rank's chunks: the critic's optimizer trains them all
        self._last = model_chunks(gpt)[-1]  # the chunk whose decoder ends the model
        self._hidden = None
        self._last.decoder.register_forward_hook(self._keep)

    def _keep(self, module, inputs, output) -> None:
        self._hidden = output

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False):
        if attention_mask.dim() == 4:  # megatron's own [B, 1, S, S] mask (packed rows)
            self._last(input_ids, position_ids, attention_mask, runtime_gather_output=True)
        else:
            forward_logits(self._last, input_ids, position_ids, attention_mask)
        hidden, self._hidden = gather_sequence(self._hidden, self._last.config), None
        # megatron's [S, B, H] -> [B, S, H]; the fp32 value head reads bf16 states as fp32
        return hidden.transpose(0, 1).float()
