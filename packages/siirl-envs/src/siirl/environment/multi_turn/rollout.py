"""Rollout plugin ``multi_turn``: multi-turn tool calling for the plain RLVR pipelines.

With ``actor_rollout_ref.rollout.multi_turn.enable=true`` the worker builds the engine of
``rollout.name`` (hf, vllm, sglang, ...) as usual and wraps it in this one
(``siirl.dag_worker.walk.engines``). ``generate(batch)`` then plays a tool-calling conversation
for each prompt row and each of its ``n`` samples: the row's prompt (re-rendered from its
``raw_prompt`` messages with the tools' schemas when the tokenizer has a chat template and
tools are configured) starts it; every turn all unfinished conversations go to the wrapped
engine together, one reply each; tool calls in the replies run (``tools``) and their
results come back as tool turns (``ToolLoop``). The result has the fields of a plain
rollout (``prompts``, ``responses`` of width ``data.max_response_length``,
``response_mask`` 0 on tool and template tokens, ``input_ids``, ``attention_mask``,
``position_ids``, ``uid``, and every input field repeated per sample), so the reward and
training nodes take it unchanged. Everything else (weight sync, ``overridden``, ...) is
the wrapped engine's.
"""

from __future__ import annotations

from typing import Any, List, Mapping, Optional

import torch

from siirl.dag_worker.data_structures import NodeOutput
from siirl.data_coordinator import protocol
from siirl.data_coordinator.dataloader.partitioned_dataset import encode_text
from siirl.data_coordinator.fields import (
    ATTENTION_MASK,
    EXTRA_INFO,
    INPUT_IDS,
    POSITION_IDS,
    PROMPTS,
    RAW_PROMPT,
    RESPONSE_MASK,
    RESPONSES,
    SAMPLE_ID,
    UID,
)
from siirl.environment.episodes.seeds import episode_key
from siirl.environment.multi_turn.conversation import Conversation, ToolLoop
from siirl.environment.multi_turn.interactions import load_interactions
from siirl.environment.tools.registry import load_tools
from siirl.errors import ConfigError
from siirl.execution.rollout_flow.engine_policy import EnginePolicy
from siirl.params.typed import to_typed

KEY = "actor_rollout_ref.rollout.multi_turn"


def _left_padded(rows: List[List[int]], pad_id: int) -> torch.Tensor:
    width = max(1, max(len(r) for r in rows))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            ids[i, width - len(row):] = torch.tensor(row, dtype=torch.long)
    return ids


class MultiTurnRollout:
    """Wraps the configured rollout engine (``peers["rollout"]``) with the tool loop."""

    peer_roles = ("actor",)

    def __init__(self, role: str = "rollout", config: Any = None, worker: Any = None,
                 peers: Optional[Mapping[str, Any]] = None, tokenizer: Any = None):
        peers = dict(peers or {})
        if peers.get("rollout") is None:
            raise ConfigError("the multi_turn rollout wraps another engine: keep "
                              "actor_rollout_ref.rollout.name=hf|vllm|sglang and set "
                              f"{KEY}.enable=true")
        config = to_typed(config)  # the launcher's typed config, or a test's dict
        self.inner, self.config, self.worker = peers["rollout"], config, worker
        self.role = role
        self._tokenizer = tokenizer if tokenizer is not None else \
            getattr(peers.get("actor"), "tokenizer", None)
        sandbox = config.reward_model.sandbox_fusion
        turns = config.actor_rollout_ref.rollout.multi_turn
        self.tools = load_tools(
            turns.tool_config_path,
            {k: getattr(sandbox, k) for k in ("url", "max_concurrent", "memory_limit_mb")},
            turns.max_tool_response_length, turns.tool_response_truncate_side)
        self.interactions = load_interactions(turns.interaction_config_path)
        self.fmt = turns.format
        ToolLoop(None, self.tools, 1, self.fmt)  # a bad format fails at start-up

    def __getattr__(self, name: str) -> Any:  # everything else is the wrapped engine's
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            found = getattr(self.inner, "tokenizer", None)
            if found is None and hasattr(self.inner, "policy"):
                found = self.inner.policy()[1]
            if found is None:
                raise RuntimeError("the multi_turn rollout found no tokenizer (no actor peer "
                                   "and the wrapped engine has none)")
            self._tokenizer = found
        return self._tokenizer

    def _sizes(self, validate: bool) -> tuple:
        """(samples per prompt, response budget), the wrapped engine's when it says."""
        if hasattr(self.inner, "sampling"):
            n = int(self.inner.sampling(validate)["n"])
        else:
            rollout = self.config.actor_rollout_ref.rollout
            n = rollout.val_kwargs.n if validate else rollout.n
        if hasattr(self.inner, "max_response_length"):
            budget = int(self.inner.max_response_length())
        else:
            budget = self.config.data.max_response_length
        return n, budget

    def _prompt(self, batch: Any, row: int, messages: Any) -> List[int]:
        """The conversation's first tokens: with tools and a chat template, the row's
        messages rendered with the tools' schemas; else the dataloader's prompt tokens."""
        tokenizer = self.tokenizer
        if self.tools.schemas and messages and getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template(list(messages), tools=self.tools.schemas,
                                                 add_generation_prompt=True, tokenize=False)
            return encode_text(tokenizer, text)
        return batch[INPUT_IDS][row][batch[ATTENTION_MASK][row].bool()].tolist()

    def generate(self, batch: Any, validate: bool = False) -> NodeOutput:
        tokenizer = self.tokenizer
        n, budget = self._sizes(validate)
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else \
            tokenizer.eos_token_id
        turns = self.config.actor_rollout_ref.rollout.multi_turn
        loop = ToolLoop(tokenizer, self.tools, budget, self.fmt, turns.max_assistant_turns,
                        turns.max_user_turns, turns.max_parallel_calls)
        keys = set(batch.keys())
        raw = protocol.get_non_tensor(batch, RAW_PROMPT) if RAW_PROMPT in keys else None
        extra = protocol.get_non_tensor(batch, EXTRA_INFO) if EXTRA_INFO in keys else None
        ids = batch[SAMPLE_ID].tolist() if SAMPLE_ID in keys else \
            list(range(batch.batch_size[0]))
        conversations: List[Conversation] = []
        noise: List[int] = []
        for row in range(batch.batch_size[0]):
            messages = list(raw[row]) if raw is not None else []
            prompt = self._prompt(batch, row, messages)
            for k in range(n):
                session = self.interactions.session(extra[row] if extra else None)
                instances = self.tools.instances(extra[row] if extra else None)
                conversations.append(loop.start(prompt, messages, session, instances))
                noise.append(episode_key(ids[row], n, k))  # distinct per sample
        policy = EnginePolicy(self.inner, pad_id, budget, validate)

        def play(prompts: List[List[int]], max_tokens: int) -> List[List[int]]:
            policy.reply_tokens = max_tokens
            return policy(prompts, [noise[i] for i, c in enumerate(conversations) if not c.done])

        def idle() -> None:  # a peer still plays: pair its (collective) rollout call
            policy.reply_tokens = 1
            policy([[pad_id]], [0])

        comm = getattr(self.worker, "comm", None)
        peers = comm.all_gather if comm is not None and comm.active else None
        try:
            loop.run(conversations, play, peers, idle if peers is not None else None)
        finally:
            for conversation in conversations:
                if conversation.interaction is not None:
                    conversation.interaction.close()
                if conversation.tool_instances is not None:
                    conversation.tool_instances.close()
        out = self._rows(batch, conversations, n, budget, pad_id)
        metrics = self._metrics(out, conversations)
        return NodeOutput(batch=out, metrics=metrics)

    @staticmethod
    def _repeat(batch: Any, n: int) -> Any:
        """Each input row ``n`` times with all its fields; ``uid`` from ``sample_id``."""
        if SAMPLE_ID in batch.keys() and UID not in batch.keys():
            out = batch.repeat_interleave(n, dim=0)
            protocol.set_non_tensor(out, UID, [str(i) for i in out[SAMPLE_ID].tolist()])
            return out
        return protocol.repeat_interleave(batch, n)

    def _rows(self, batch: Any, conversations: List[Conversation], n: int, budget: int,
              pad_id: int) -> Any:
        out = self._repeat(batch, n)
        prompts = _left_padded([c.ids[:c.prompt_length] for c in conversations], pad_id)
        prompt_mask = _left_padded([[1] * c.prompt_length for c in conversations], 0)
        responses = torch.full((len(conversations), budget), pad_id, dtype=torch.long)
        response_mask = torch.zeros((len(conversations), budget), dtype=torch.float32)
        attention = torch.zeros((len(conversations), budget), dtype=torch.long)
        for row, conversation in enumerate(conversations):
            got = conversation.response_ids[:budget]
            responses[row, :len(got)] = torch.tensor(got, dtype=torch.long)
            response_mask[row, :len(got)] = torch.tensor(conversation.mask[:budget],
                                                         dtype=torch.float32)
            attention[row, :len(got)] = 1  # the policy reads tool tokens; no loss on them
        mask = torch.cat([prompt_mask, attention], dim=1)
        # prompts may be wider than the input's (tool schemas): replace, not update in place
        for key, value in ((PROMPTS, prompts), (RESPONSES, responses),
                           (RESPONSE_MASK, response_mask),
                           (INPUT_IDS, torch.cat([prompts, responses], dim=1)),
                           (ATTENTION_MASK, mask),
                           (POSITION_IDS, (mask.cumsum(dim=1) - 1).clamp(min=0))):
            if key in out.keys():
                del out[key]
            out.set(key, value)
        return out

    @staticmethod
    def _metrics(out: Any, conversations: List[Conversation]) -> dict:
        trained = out[RESPONSE_MASK].sum(dim=1)
        lengths = torch.tensor([float(len(c.response_ids)) for c in conversations])
        metrics = {
            "response_length/mean": lengths.mean().item(),
            "response_length/max": lengths.max().item(),
            "response_length/min": lengths.min().item(),
            "rollout/tokens": trained.sum().item(),
        }
        metrics.update(ToolLoop.metrics(conversations))
        return metrics
