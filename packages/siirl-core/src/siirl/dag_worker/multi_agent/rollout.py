"""The multi-agent rollout node (the default function of ROLLOUT nodes in a workflow with
several agent groups, e.g. siiRL's MARFT Reasoner -> Actor files).

The rollout nodes, in execution order, are the agents in acting order. The first of them
plays whole episodes for all agents; the others only report. For every prompt row,
``rollout.n`` episodes (the first agent's setting) run for up to
``rollout.multi_turn.max_assistant_turns`` turns (1 when unset). In a turn each agent, in
order, reads the episode's text through its ``pre_process``, replies with its own rollout
engine (one reply per episode, seeded per episode, turn and agent, so reruns repeat), and
hands the text on through ``post_process``; an agent whose node names ``env_path`` then
steps the episode's environment with the turn's texts. The environment's score and its
``done`` end the episode; an environment that raises ends its episode with score 0 (counted
in ``multi_agent/env_errors``, warned once). The turns are scheduled by the episode runner every
episode loop shares (``siirl.execution.rollout_flow.episode_runner``: one wave, at most
``max_assistant_turns`` turns).

Each agent's row holds its prompt and reply of the episode's last turn, under its agent
group's prefix (``agent_group_<g>_responses``, ...); the episode's fields are shared
(``uid``, ``data_source``, the ground truth, ``env_scores``, ``complete``). With
``validate=True`` (the validator) the node returns the last agent's rows scored: by the
environment with ``rewards_with_env``, or else by that agent's reward engine.
"""

from __future__ import annotations

import asyncio
import warnings
import zlib
from typing import Any, Dict, List, Sequence

import torch

from siirl.dag_worker.data_structures import NodeOutput
from siirl.dag_worker.multi_agent.agent_groups import AgentGroups, prefix
from siirl.dag_worker.multi_agent.agent_process import AgentProcess, step_env
from siirl.data_coordinator import protocol
from siirl.data_coordinator.fields import (
    ATTENTION_MASK,
    COMPLETE,
    DATA_SOURCE,
    ENV_SCORES,
    GROUND_TRUTH,
    INPUT_IDS,
    POSITION_IDS,
    PROMPTS,
    RESPONSE_MASK,
    RESPONSES,
    REWARD_MODEL,
    SAMPLE_ID,
    UID,
)
from siirl.errors import ConfigError
from siirl.execution.dag.node import NodeRole
from siirl.execution.rollout_flow.engine_policy import EnginePolicy, left_padded
from siirl.execution.rollout_flow.episode_runner import EpisodeRunner
from siirl.params.key_paths import value_at

ROLLOUT = "actor_rollout_ref.rollout"
_PROCESSES: Dict[str, AgentProcess] = {}
_WARNED: set = set()


def rewards_with_env(config: Any, graph: Any) -> bool:
    """``rollout.agent.rewards_with_env`` (siiRL's key) or any node's agent option."""
    return config.actor_rollout_ref.rollout.agent.rewards_with_env or any(
        n.agent_options.get("rewards_with_env") for n in graph.nodes.values())


def rollout_chain(graph: Any) -> List[Any]:
    return [graph.nodes[i] for i in graph.get_execution_order()
            if graph.nodes[i].node_role is NodeRole.ROLLOUT]


def _process(node: Any) -> AgentProcess:
    if node.node_id not in _PROCESSES:
        _PROCESSES[node.node_id] = AgentProcess(node)
    return _PROCESSES[node.node_id]


def _unpadded(ids: torch.Tensor, mask: torch.Tensor) -> List[List[int]]:
    return [row[m.bool()].tolist() for row, m in zip(ids, mask, strict=True)]


def _ground_truths(batch: Any) -> List[Any]:
    keys = batch.keys()
    if GROUND_TRUTH in keys:
        return protocol.get_non_tensor(batch, GROUND_TRUTH)
    if REWARD_MODEL in keys:
        return [(row or {}).get("ground_truth") for row in
                protocol.get_non_tensor(batch, REWARD_MODEL)]
    return [None] * batch.batch_size[0]


class _Episode:
    def __init__(self, prompt_ids: List[int], ground_truth: Any, key: int):
        self.text_ids = list(prompt_ids)  # the episode so far, as the next agent reads it
        self.ground_truth = ground_truth
        self.key = key
        self.obs: Dict[int, Any] = {}
        self.last: Dict[int, tuple] = {}  # group -> (prompt ids, reply ids) of its last turn
        self.turn_texts: List[str] = []
        self.env = None
        self.score = 0.0
        self.done = False
        self.turns = 0
        self.env_error = False


def _agent_rows(episodes: Sequence[_Episode], group: int, pad_id: int,
                response_length: int) -> Dict[str, torch.Tensor]:
    prompts = [e.last.get(group, ([pad_id], []))[0] for e in episodes]
    replies = [e.last.get(group, ([pad_id], []))[1][:response_length] for e in episodes]
    left = left_padded(prompts, pad_id)
    responses = torch.full((len(replies), response_length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(replies), response_length), dtype=torch.float32)
    for row, reply in enumerate(replies):
        if reply:
            responses[row, :len(reply)] = torch.tensor(reply, dtype=torch.long)
            mask[row, :len(reply)] = 1.0
    attention = torch.cat([left[ATTENTION_MASK], mask.long()], dim=1)
    return {PROMPTS: left[INPUT_IDS], RESPONSES: responses, RESPONSE_MASK: mask,
            INPUT_IDS: torch.cat([left[INPUT_IDS], responses], dim=1),
            ATTENTION_MASK: attention,
            POSITION_IDS: (attention.cumsum(dim=1) - 1).clamp(min=0)}


def _close(episode: _Episode) -> None:
    close = getattr(episode.env, "close", None)
    if callable(close):
        close()


def _step_envs(agent: AgentProcess, episodes: List[_Episode], tokenizer: Any) -> int:
    """Step every active episode's environment with this turn's texts; returns errors."""
    async def one(episode: _Episode):
        try:
            return await step_env(episode.env, list(episode.turn_texts), episode.ground_truth)
        except Exception as exc:  # contained: the episode ends with score 0
            if agent.node_id not in _WARNED:
                _WARNED.add(agent.node_id)
                warnings.warn(f"node '{agent.node_id}': the environment's step raised "
                              f"{type(exc).__name__}: {exc}; such episodes end with score 0 "
                              "(counted in multi_agent/env_errors)", stacklevel=2)
            return None

    async def all_of():
        return await asyncio.gather(*(one(e) for e in episodes))

    errors = 0
    for episode, result in zip(episodes, asyncio.run(all_of()), strict=True):
        if result is None:
            episode.score, episode.done, episode.env_error = 0.0, True, True
            errors += 1
            continue
        next_obs, score, done = result
        episode.score, episode.done = float(score), bool(done)
        if isinstance(next_obs, (list, tuple)) and next_obs:
            for index, obs in enumerate(next_obs):
                episode.obs[index] = obs
            last = next_obs[-1]
            episode.text_ids = tokenizer.encode(last, add_special_tokens=False) \
                if isinstance(last, str) else list(last)
    return errors


def play(worker: Any, config: Any, batch: Any, validate: bool) -> tuple:
    """Episodes for the prompt rows of ``batch``: (rows of every agent, metrics)."""
    agents: AgentGroups = worker.agents
    chain = rollout_chain(worker.taskgraph)
    tokenizer = worker.agents.engines[chain[0].agent_group].tokenizer()
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else \
        tokenizer.eos_token_id
    first = agents.configs[chain[0].agent_group]
    sampling = first.actor_rollout_ref.rollout
    n = (sampling.val_kwargs.n if validate else sampling.n) or 1
    # rollout.multi_turn is siirl-envs' section: without it an episode is one turn
    turns = value_at(config, f"{ROLLOUT}.multi_turn.max_assistant_turns") or 1
    if value_at(config, f"{ROLLOUT}.multi_turn.use_all_traj", False):
        raise ConfigError(f"{ROLLOUT}.multi_turn.use_all_traj=true is not supported: each "
                          "agent trains on its last turn of the episode")
    batch = batch.copy()
    protocol.set_non_tensor(batch, UID, [str(s) for s in batch[SAMPLE_ID].tolist()])
    prompts = _unpadded(batch[INPUT_IDS], batch[ATTENTION_MASK])
    truths = _ground_truths(batch)
    sample_ids = batch[SAMPLE_ID].tolist()
    episodes = [_Episode(prompts[row], truths[row], int(sample_ids[row]) * n + k)
                for row in range(len(prompts)) for k in range(n)]
    processes = [_process(node) for node in chain]
    env_errors = 0

    def start(indices: List[int], _slots: List[int]) -> List[_Episode]:
        started = [episodes[i] for i in indices]
        try:
            for agent in processes:
                if agent.env_class is not None:
                    for episode in started:
                        episode.env = agent.new_env()
        except BaseException:
            for episode in started:
                _close(episode)
            raise
        return started

    def play_turn(active: List[_Episode], _slots: List[int], turn: int) -> None:
        """One turn: each agent in acting order replies for every active episode."""
        nonlocal env_errors
        for e in active:
            e.turn_texts, e.turns = [], turn + 1
        for index, (node, agent) in enumerate(zip(chain, processes, strict=True)):
            group = node.agent_group
            own = agents.configs[group]
            length = own.data.max_response_length  # what the rollout engines generate
            limit = own.actor_rollout_ref.rollout.prompt_length
            reads = [agent.pre(tokenizer, e.text_ids, e.obs.get(index))[-limit:]
                     for e in active]
            keys = [zlib.crc32(f"{e.key}:{turn}:{index}".encode()) for e in active]
            replies = EnginePolicy(agents.engines[group].rollout, pad_id, length,
                                   validate)(reads, keys)
            for e, read, reply in zip(active, reads, replies, strict=True):
                e.last[group] = (read, reply)
                e.text_ids = agent.post(tokenizer, e.text_ids, reply)
                e.turn_texts.append(tokenizer.decode(e.text_ids, skip_special_tokens=True))
            if agent.env_class is not None:
                env_errors += _step_envs(agent, active, tokenizer)
                active = [e for e in active if not e.done]
                if not active:
                    break

    # one wave of all episodes, at most ``turns`` turns; every episode's environment is
    # closed at the end, on a failure too
    EpisodeRunner(waves=True, max_turns=turns).run(len(episodes), start, play_turn,
                                                   finished=_close)
    rows = protocol.repeat_interleave(batch, n)
    for key in (INPUT_IDS, ATTENTION_MASK, POSITION_IDS):
        if key in rows.keys():
            del rows[key]  # the agents' own prompts replace the dataset's
    metrics: Dict[str, Any] = {"multi_agent/turns/mean": sum(e.turns for e in episodes) /
                               len(episodes)}
    has_env = any(agent.env_class is not None for agent in processes)
    if has_env:
        scores = torch.tensor([e.score for e in episodes], dtype=torch.float32)
        rows.set(ENV_SCORES, scores)
        rows.set(COMPLETE, (scores > 0).float())
        metrics.update({"multi_agent/env_score/mean": scores.mean(),
                        "multi_agent/success_rate": (scores > 0).float().mean(),
                        "multi_agent/env_errors": float(env_errors)})
    for node in chain:
        group = node.agent_group
        length = agents.configs[group].data.max_response_length
        for key, value in _agent_rows(episodes, group, pad_id, length).items():
            rows.set(prefix(group) + key, value)
        metrics[f"agent_group_{group}/response_length/mean"] = \
            rows[prefix(group) + RESPONSE_MASK].sum(dim=-1).mean()
    return rows, metrics


def env_rewards(batch: Any) -> Any:
    """``token_level_scores``/``rewards``: the episode's environment score on the last
    response token of each row (the rows of one agent)."""
    from siirl.data_coordinator.fields import TOKEN_LEVEL_REWARDS, TOKEN_LEVEL_SCORES

    mask = batch[RESPONSE_MASK]
    scores = torch.zeros_like(mask, dtype=torch.float32)
    lengths = mask.sum(dim=-1).long()
    rows = torch.nonzero(lengths > 0).flatten()
    scores[rows, lengths[rows] - 1] = batch[ENV_SCORES][rows]
    batch.set(TOKEN_LEVEL_SCORES, scores)
    batch.set(TOKEN_LEVEL_REWARDS, scores.clone())
    return batch


def multi_agent_rollout(batch: Any, config: Any = None, worker: Any = None, node: Any = None,
                        validate: bool = False, **_: Any) -> NodeOutput:
    """Node function of every rollout node of a multi-agent workflow (see the module)."""
    chain = rollout_chain(worker.taskgraph)
    if node is not None and node.node_id != chain[0].node_id and not validate:
        return NodeOutput(batch=None)  # its agent played inside the first rollout node
    rows, metrics = play(worker, config, batch, validate)
    if not validate:
        return NodeOutput(batch=rows, metrics=metrics)
    last = chain[-1].agent_group
    view = AgentGroups.view(rows, last)
    if ENV_SCORES in view.keys() and rewards_with_env(config, worker.taskgraph):
        scored = env_rewards(view)
    else:
        scored = worker.agents.engines[last].reward.compute_reward(view).batch
    if DATA_SOURCE not in scored.keys():
        protocol.set_non_tensor(scored, DATA_SOURCE, ["multi_agent"] * scored.batch_size[0])
    return NodeOutput(batch=scored, metrics=metrics)


multi_agent_rollout.__siirl_all_agents__ = True
