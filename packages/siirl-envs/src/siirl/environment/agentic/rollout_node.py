"""The AGENTIC rollout node: episodes in environments, played by the worker's rollout engine,
returned as ordinary rollout rows (so the advantage, log-prob and training nodes are GRPO's).

Each prompt row of the dataloader names one episode group: its ``sample_id`` picks the
environment tag (``env_manager.tags``, in turn) and, with ``trainer.seed`` and the step, the
episode seed; ``rollout.n`` episodes start from that seed (GRPO's group, ``uid``). Every
turn, all unfinished episodes go to the rollout engine together, one reply each
(``rollout.overridden(n=1, ...)``), their noise keyed by episode, so a rerun or a resume
replays the same episodes. The episode's reward sits on its last agent token; the
response mask is 1 on agent tokens only, so environment tokens are never trained on. Rows
carry their tag as ``data_source`` and the episode's success as ``complete``; with
``validate=True`` (the validator calls the node so) the episodes use ``val_kwargs`` and the
same seeds at every evaluation.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import torch

from siirl.dag_worker.data_structures import NodeOutput
from siirl.data_coordinator import protocol
from siirl.data_coordinator.fields import (
    ATTENTION_MASK,
    COMPLETE,
    DATA_SOURCE,
    INPUT_IDS,
    POSITION_IDS,
    PROMPTS,
    RESPONSE_MASK,
    RESPONSES,
    SAMPLE_ID,
    TOKEN_LEVEL_REWARDS,
    TOKEN_LEVEL_SCORES,
    UID,
)
from siirl.environment import text_controls as controls
from siirl.environment.agentic.trajectory import Episode, TrajectoryEnvManager
from siirl.environment.episodes.seeds import episode_key, episode_seed
from siirl.environment.registry import make_env
from siirl.errors import ConfigError
from siirl.execution.rollout_flow.engine_policy import EnginePolicy, left_padded

_POOLS: Dict[tuple, Any] = {}  # (processes, timeout) -> this worker's environment processes


def _pool(settings: Any) -> Any:
    """This training worker's environment processes (kept for the run), or None."""
    processes = int(settings.env_processes or 0)
    if processes <= 0:
        return None
    key = (processes, float(settings.step_timeout_s))
    if key not in _POOLS:
        import atexit

        from siirl.environment.agentic.env_workers import EnvWorkerPool

        _POOLS[key] = EnvWorkerPool(*key)
        atexit.register(_POOLS[key].close)
    return _POOLS[key]


# ROLL's scheduler settings when a configuration has none (a hand-built one)
def _tags(config: Any, validate: bool = False) -> List[str]:
    custom = dict(config.custom_envs)
    if not custom:
        raise ConfigError("algorithm.workflow_type=AGENTIC needs custom_envs: e.g. "
                          "custom_envs.SimpleSokoban.env_type=sokoban")
    scheduler = config.val_env_manager if validate else config.train_env_manager
    own = list(scheduler.tags or [])
    tags = own or list(config.env_manager.tags or custom)
    unknown = [tag for tag in tags if tag not in custom]
    if unknown:
        where = ("val_env_manager" if validate else "train_env_manager") + ".tags" if own \
            else "env_manager.tags"
        raise ConfigError(f"{where} names {unknown}, which custom_envs lacks "
                          f"(it has {sorted(custom)})")
    return tags


def tag_of(sample_id: int, tags: Sequence[str], partition: Optional[Sequence[int]]) -> str:
    """The tag a prompt row plays: the tags in turn, or by ``num_groups_partition`` shares
    (consecutive sample ids fill each tag's share), so every worker agrees."""
    if not partition:
        return tags[int(sample_id) % len(tags)]
    position = int(sample_id) % sum(int(v) for v in partition)
    for tag, share in zip(tags, partition, strict=True):
        if position < int(share):
            return tag
        position -= int(share)
    return tags[-1]


def _rows(episodes: Sequence[Episode], pad_id: int) -> Any:
    prompts = left_padded([e.ids[:e.prompt_length] for e in episodes], pad_id)
    width = max(1, max(len(e.response_ids) for e in episodes))
    responses = torch.full((len(episodes), width), pad_id, dtype=torch.long)
    response_mask = torch.zeros((len(episodes), width), dtype=torch.float32)
    scores = torch.zeros((len(episodes), width), dtype=torch.float32)
    for row, episode in enumerate(episodes):
        ids = episode.response_ids
        responses[row, :len(ids)] = torch.tensor(ids, dtype=torch.long)
        response_mask[row, :len(ids)] = torch.tensor(episode.mask, dtype=torch.float32)
        agent = [i for i, m in enumerate(episode.mask) if m]
        scores[row, agent[-1] if agent else 0] = episode.reward
    prompt_ids, prompt_mask = prompts[INPUT_IDS], prompts[ATTENTION_MASK]
    # attention covers environment tokens too (the policy reads them); the loss does not
    lengths = torch.tensor([len(e.response_ids) for e in episodes])
    attention = torch.cat([prompt_mask, (torch.arange(width) < lengths[:, None]).long()],
                          dim=1)
    batch = protocol.make_batch({
        PROMPTS: prompt_ids, RESPONSES: responses, RESPONSE_MASK: response_mask,
        INPUT_IDS: torch.cat([prompt_ids, responses], dim=1), ATTENTION_MASK: attention,
        POSITION_IDS: (attention.cumsum(dim=1) - 1).clamp(min=0),
        TOKEN_LEVEL_SCORES: scores, TOKEN_LEVEL_REWARDS: scores.clone(),
    })
    batch.set(COMPLETE, torch.tensor([float(e.success) for e in episodes]))
    if any(e.final_render is not None for e in episodes):
        protocol.set_non_tensor(batch, "render", [e.final_render or "" for e in episodes])
    protocol.set_non_tensor(batch, UID, [e.group for e in episodes])
    protocol.set_non_tensor(batch, DATA_SOURCE, [e.tag for e in episodes])
    return batch


def discounted_returns(rewards: Sequence[float], gamma: float) -> List[float]:
    """``G_t = r_t + gamma * G_{t+1}`` for every turn t."""
    returns, running = [0.0] * len(rewards), 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = rewards[t] + gamma * running
        returns[t] = running
    return returns


def _step_rows(episodes: Sequence[Episode], pad_id: int, gamma: float) -> Any:
    """The step-level env manager's rows: one per turn, its prompt the episode so far, its
    response the turn's reply, its score the discounted return from that turn on."""
    prompts, replies, scores, sources, groups, success = [], [], [], [], [], []
    for episode in episodes:
        returns = discounted_returns(episode.turn_rewards, gamma)
        for (start, end), value in zip(episode.turn_spans, returns, strict=True):
            prompts.append(episode.ids[:start])
            replies.append(episode.ids[start:end])
            scores.append(value)
            sources.append(episode.tag)
            groups.append(episode.group)
            success.append(float(episode.success))
    if not prompts:
        raise RuntimeError("no episode got to its first turn")
    left = left_padded(prompts, pad_id)
    width = max(1, max(len(r) for r in replies))
    responses = torch.full((len(replies), width), pad_id, dtype=torch.long)
    response_mask = torch.zeros((len(replies), width), dtype=torch.float32)
    token_scores = torch.zeros((len(replies), width), dtype=torch.float32)
    for row, reply in enumerate(replies):
        responses[row, :len(reply)] = torch.tensor(reply, dtype=torch.long)
        response_mask[row, :len(reply)] = 1.0
        token_scores[row, max(len(reply) - 1, 0)] = scores[row]
    attention = torch.cat([left[ATTENTION_MASK], response_mask.long()], dim=1)
    batch = protocol.make_batch({
        PROMPTS: left[INPUT_IDS], RESPONSES: responses, RESPONSE_MASK: response_mask,
        INPUT_IDS: torch.cat([left[INPUT_IDS], responses], dim=1), ATTENTION_MASK: attention,
        POSITION_IDS: (attention.cumsum(dim=1) - 1).clamp(min=0),
        TOKEN_LEVEL_SCORES: token_scores, TOKEN_LEVEL_REWARDS: token_scores.clone(),
        COMPLETE: torch.tensor(success),
    })
    protocol.set_non_tensor(batch, UID, groups)
    protocol.set_non_tensor(batch, DATA_SOURCE, sources)
    return batch


def _as_many_rows_as_peers(rows: Any, worker: Any) -> Any:
    """Step rows follow each worker's episodes' turns, but the workers' updates must take
    the same number of optimizer steps (collectives pair up): pad every worker to the
    largest row count with copies of its first row that train nothing (mask 0, score 0,
    a group of their own, named by worker so no two workers share one)."""
    comm = getattr(worker, "comm", None)
    if comm is None or not comm.active:
        return rows
    count = rows.batch_size[0]
    missing = max(comm.all_gather(count)) - count
    if missing <= 0:
        return rows
    pads = protocol.select_rows(rows, [0] * missing).clone()
    for key in (RESPONSE_MASK, TOKEN_LEVEL_SCORES, TOKEN_LEVEL_REWARDS, COMPLETE):
        pads.set(key, torch.zeros_like(pads[key]))
    protocol.set_non_tensor(pads, UID, [f"pad:{comm.rank}:{i}" for i in range(missing)])
    return protocol.concat([rows, pads])


NORMALIZATIONS = ("identity", "mean", "mean_std")
GROUPINGS = ("state", "batch")


def normalize_scores(rows: Any, grouping: str, method: str, eps: float = 1e-6,
                     reduction: Any = None) -> None:
    """ROLL's score normalization, in place on ``token_level_scores``/``rewards``: each row's
    score minus its group's mean (``mean``), also divided by the group's unbiased std
    (``mean_std``); groups are the episodes from one seed (``state``, always on one worker)
    or the whole batch, every worker's rows (``batch``: sums through ``reduction``, a
    ``core_algos.batch_reduction`` object; None: these rows are the whole batch)."""
    from siirl.dag_worker.core_algos.batch_reduction import LOCAL

    if method == "identity":
        return
    scores = rows[TOKEN_LEVEL_SCORES]
    totals = scores.sum(dim=-1)
    if grouping == "batch":
        normalized = _standardized(totals, method, eps, reduction or LOCAL)
    else:
        normalized = totals.clone()
        keys = protocol.get_non_tensor(rows, UID)
        for key in set(keys):
            index = torch.tensor([i for i, k in enumerate(keys) if k == key])
            normalized[index] = _standardized(totals[index], method, eps, LOCAL)
    # one score per row, on its last trained token (the episode's or turn's last reply token)
    mask = rows[RESPONSE_MASK]
    width = mask.shape[1]
    last = width - 1 - mask.flip(dims=[1]).argmax(dim=-1)
    new = torch.zeros_like(scores)
    new[torch.arange(len(totals)), last] = normalized
    rows.set(TOKEN_LEVEL_SCORES, new)
    rows.set(TOKEN_LEVEL_REWARDS, new.clone())


def _standardized(values: torch.Tensor, method: str, eps: float, reduction: Any):
    """``values`` minus the mean over ``reduction``'s rows, divided by their unbiased std
    plus ``eps`` for ``mean_std`` (not for a single row); float64 sums."""
    x = values.to(torch.float64)
    total, count = reduction.sum([x.sum(), x.numel()])
    centred = x - total / count.clamp_min(1)
    if method == "mean_std":
        (squares,) = reduction.sum([centred.pow(2).sum()])
        if count > 1:
            centred = centred / ((squares / (count - 1)).sqrt() + eps)
    return centred.to(values.dtype)


def agentic_rollout(batch: Any, config: Any = None, worker: Any = None,
                    validate: bool = False, node: Any = None, **_: Any) -> NodeOutput:
    """Node function: episodes for the prompt rows of ``batch`` -> rollout rows."""
    rollout, actor = worker.engines.rollout, worker.engines.actor
    tokenizer = actor.tokenizer
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else \
        tokenizer.eos_token_id
    custom = dict(config.custom_envs)
    tags = _tags(config, validate)
    scheduler = config.val_env_manager if validate else config.train_env_manager
    sampling = config.actor_rollout_ref.rollout
    n = (sampling.val_kwargs.n if validate else sampling.n) or 1
    if validate and scheduler.group_size:  # training's must equal rollout.n (checked)
        n = int(scheduler.group_size)
    run_seed = config.trainer.seed or 0
    # validation replays the same episodes at every evaluation; training gets fresh ones
    step = -1 if validate else int(getattr(worker, "global_step", 0) or 0)
    settings = config.env_manager
    reply_tokens = settings.max_tokens_per_step or config.data.max_response_length
    manager = TrajectoryEnvManager(tokenizer, settings.max_actions_per_traj,
                                   settings.max_episode_tokens, settings.format_penalty,
                                   settings.error_penalty)
    pool = _pool(settings)
    partition = scheduler.num_groups_partition
    said = {tag: controls.action_words(tag, custom[tag]) for tag in tags}
    # validation reports the environments' own scores, so the coin pays training only
    coin_tags = {tag for tag in tags if not validate and
                 controls.reward_kind(tag, custom[tag]) == "coin_flip"}

    def starter(tag: str, seed: int, group: str, key: int):
        def start():
            entry = custom[tag]
            instruction = entry.get("env_instruction")  # ROLL's key: the agent's rules
            if pool is not None:
                env = pool.create(entry["env_type"], entry.get("env_config"), instruction)
            else:
                env = make_env(entry["env_type"], entry.get("env_config"),
                               f"custom_envs.{tag}.env_type")
                if instruction is not None:
                    env.instructions = str(instruction)
            episode = manager.start(env, seed, group=group, tag=tag, key=key)
            episode.action_words = said[tag]
            return episode
        return start

    starts = []
    for sample_id in batch[SAMPLE_ID].tolist():
        tag = tag_of(int(sample_id), tags, partition)
        seed = episode_seed(run_seed, int(sample_id), step)
        starts += [starter(tag, seed, str(sample_id), episode_key(sample_id, n, k))
                   for k in range(n)]
    policy = EnginePolicy(rollout, pad_id, reply_tokens, validate)
    in_flight = int(scheduler.max_env_num_per_worker or 0)

    def finished(episode: Episode) -> None:
        if validate:  # ROLL's render output: the final state, in the validation dumps
            try:
                episode.final_render = str(episode.env.render())
            except Exception:  # a render is optional; an environment may not have one
                episode.final_render = None
        episode.env.close()

    comm = getattr(worker, "comm", None)  # FSDP-sharded rollout calls pair up over workers
    peers = comm.all_gather if comm is not None and comm.active else None
    episodes = manager.run_scheduled(starts, policy, in_flight, finished, peers)
    for episode in episodes:
        if episode.tag in coin_tags:
            controls.coin_flip(episode, run_seed, step)
    mode = str(settings.mode or "trajectory").lower()
    if mode not in ("trajectory", "step"):
        raise ConfigError(f"env_manager.mode={settings.mode!r}: use trajectory (an episode "
                          "is one sample) or step (each turn is one)")
    # validation scores whole episodes whatever the training mode
    out = _step_rows(episodes, pad_id, float(settings.gamma)) \
        if mode == "step" and not validate else _rows(episodes, pad_id)
    norm = settings.reward_normalization
    if str(norm.method) not in NORMALIZATIONS or str(norm.grouping) not in GROUPINGS:
        raise ConfigError(f"env_manager.reward_normalization: method={norm.method!r} "
                          f"(one of {NORMALIZATIONS}), grouping={norm.grouping!r} (one of "
                          f"{GROUPINGS})")
    if not validate:  # validation reports the environments' own scores
        from siirl.dag_worker.core_algos.batch_reduction import reduction_for

        normalize_scores(out, str(norm.grouping), str(norm.method),
                         reduction=reduction_for(worker, node))
    if mode == "step" and not validate:
        out = _as_many_rows_as_peers(out, worker)
    prefix = "val-env" if validate else "env"
    return NodeOutput(batch=out, metrics=manager.metrics(episodes, prefix))
