"""The EMBODIED rollout node: a vision-language-action policy plays episodes in embodied
environments; each episode becomes one rollout row.

Each prompt row of the dataloader names one episode group: its ``sample_id`` picks the task
(the environment's tasks in turn) and, with ``trainer.seed`` and the step, the seed;
``rollout.n`` episodes start from that ``(task, seed)`` (GRPO's group, ``uid``). Every chunk
step, the observations of all unfinished episodes go to the worker's rollout engine in one
batch: the prompt (instruction + the VLA's image and proprio placeholders,
:mod:`.vla_inputs`) with ``pixel_values`` and ``proprio``; its reply is ``k * D`` action
tokens, decoded into a chunk of ``k`` actions (:mod:`.action_tokens`).

A row holds the whole episode (``episode_rows``): the prompt, the chunks' action tokens side
by side as the response, and one observation per chunk (``pixel_values [T, H, W, 3]``,
``proprio [T, P]``, zeros past the end), which the actor's episode head
(``siirl.engine.actor.embodied_actor``) reads back one chunk at a time. ``complete`` is the
episode's success, ``env_scores`` the environment's rewards summed over it, ``task_id``
and ``data_source`` its task; with SRPO
(``actor_rollout_ref.embodied.video_embedding_model_path``) ``trajectory_embedding`` is its
video's embedding. The reward node scores the rows (``reward_manager=embodied``); validation
(``validate=True``) scores them here, greedy by default (``rollout.val_kwargs``), and writes
each task's first episode as a GIF under ``<trainer.default_local_dir>/val_videos``.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch

from siirl.dag_worker.data_structures import NodeOutput
from siirl.data_coordinator import protocol
from siirl.data_coordinator.fields import (
    ATTENTION_MASK,
    COMPLETE,
    DATA_SOURCE,
    ENV_SCORES,
    INPUT_IDS,
    PIXEL_VALUES,
    POSITION_IDS,
    PROMPTS,
    PROPRIO,
    RESPONSE_MASK,
    RESPONSES,
    SAMPLE_ID,
    TASK_ID,
    TOKEN_LEVEL_REWARDS,
    TOKEN_LEVEL_SCORES,
    TRAJECTORY_EMBEDDING,
    UID,
)
from siirl.environment.embodied.controls import env_action_map
from siirl.environment.embodied.vla_inputs import action_tokenizer_for, vla_prompt_ids
from siirl.environment.embodied.worker_envs import EMBODIED, worker_envs
from siirl.environment.episodes.seeds import episode_key, episode_seed
from siirl.errors import ConfigError
from siirl.execution.rollout_flow.engine_policy import EnginePolicy, left_padded
from siirl.execution.rollout_flow.episode_runner import EpisodeRunner


# ------------------------------------------------------------------------------ episodes
class Episode(SimpleNamespace):
    """One episode's record: prompt ids, per chunk the observation it acted on and the
    action tokens it chose, the frames seen, success and reward."""


_SEEN = ("image", "proprio", "instruction")  # an observation's parts, per environment


def play(envs: Any, episodes: List[Episode], act, chunks: int, wave: int,
         keep_in_step: bool, record_frames: bool) -> None:
    """Play ``episodes`` on the shared episode runner, in waves of ``wave`` environments
    (``envs``' slots), ``chunks`` chunk steps at most. ``act(episodes, observations,
    record=True) -> [m, k, D]``. With ``keep_in_step`` (several workers generate with
    gathered weights) every chunk step calls ``act``, on one episode's last observation,
    unrecorded, when all have finished, so the workers' calls pair up."""

    def start(indices: List[int], slots: List[int]) -> List[Episode]:
        group = [episodes[i] for i in indices]
        obs = envs.reset([e.task for e in group], [e.seed for e in group], slots)
        for j, episode in enumerate(group):
            episode.current = {k: obs[k][j] for k in _SEEN}
            episode.frames = [episode.current["image"]] if record_frames else []
        return group

    def chunk_actions(live: List[Episode], _slots: List[int], _turn: int) -> list:
        return list(zip(live, act(live, [e.current for e in live]), strict=True))

    def step(playing: List[Episode], rows: list, slots: List[int]) -> list:
        obs, rewards, dones, infos = envs.step(np.stack(rows), slots)
        return [({k: obs[k][row] for k in _SEEN}, rewards[row], dones[row], infos[row])
                for row in range(len(playing))]

    def observe(episode: Episode, result: tuple) -> None:
        seen, reward, done, info = result
        episode.reward += float(reward)
        episode.success = episode.success or bool(info.get("success"))
        episode.done = bool(done)
        episode.error = info.get("error") or episode.error
        episode.current = seen
        if record_frames:
            episode.frames.append(seen["image"])

    def idle(group: List[Episode]) -> None:
        act([group[0]], [group[0].current], record=False)

    EpisodeRunner(wave, waves=True, max_turns=chunks).run(
        len(episodes), start, chunk_actions, step=step, observe=observe,
        finished=lambda episode: setattr(episode, "current", None),
        idle=idle if keep_in_step else None)


def episode_rows(episodes: Sequence[Episode], pad_id: int, chunks: int,
                 per_chunk: int) -> Any:
    """One row per episode (see the module docstring)."""
    count = len(episodes)
    left = left_padded([e.prompt for e in episodes], pad_id)
    prompts, prompt_mask = left[INPUT_IDS], left[ATTENTION_MASK]
    responses = torch.full((count, chunks * per_chunk), pad_id, dtype=torch.long)
    response_mask = torch.zeros((count, chunks * per_chunk), dtype=torch.float32)
    image_shape = episodes[0].images[0].shape
    pixels = torch.zeros((count, chunks, *image_shape), dtype=torch.uint8)
    proprio_dim = max(len(e.proprios[0]) for e in episodes)
    proprio = torch.zeros((count, chunks, proprio_dim), dtype=torch.float32)
    for row, episode in enumerate(episodes):
        played = len(episode.tokens)
        if played:
            responses[row, :played * per_chunk] = torch.as_tensor(
                np.concatenate(episode.tokens), dtype=torch.long)
            response_mask[row, :played * per_chunk] = 1.0
            pixels[row, :played] = torch.from_numpy(np.stack(episode.images))
            values = np.stack(episode.proprios)
            proprio[row, :played, :values.shape[1]] = torch.from_numpy(values)
    attention = torch.cat([prompt_mask, response_mask.long()], dim=1)
    batch = protocol.make_batch({
        PROMPTS: prompts, RESPONSES: responses, RESPONSE_MASK: response_mask,
        INPUT_IDS: torch.cat([prompts, responses], dim=1), ATTENTION_MASK: attention,
        POSITION_IDS: (attention.cumsum(dim=1) - 1).clamp(min=0),
        PIXEL_VALUES: pixels, PROPRIO: proprio,
        COMPLETE: torch.tensor([float(e.success) for e in episodes]),
        ENV_SCORES: torch.tensor([float(e.reward) for e in episodes], dtype=torch.float32)})
    protocol.set_non_tensor(batch, UID, [e.group for e in episodes])
    protocol.set_non_tensor(batch, TASK_ID, [e.task for e in episodes])
    protocol.set_non_tensor(batch, DATA_SOURCE, [e.task for e in episodes])
    return batch


def _success_scores(rows: Any) -> None:
    """Validation's own scores: success (1/0) on each row's last action token."""
    mask = rows[RESPONSE_MASK]
    scores = torch.zeros_like(mask)
    last = (mask.sum(dim=1).long() - 1).clamp(min=0)
    scores[torch.arange(mask.shape[0]), last] = rows[COMPLETE].float()
    rows.set(TOKEN_LEVEL_SCORES, scores)
    rows.set(TOKEN_LEVEL_REWARDS, scores.clone())


_ENCODERS: Dict[tuple, Any] = {}


def _video_encoder(config: Any) -> Optional[Any]:
    """SRPO's frozen video encoder, or None (plain GRPO on success)."""
    path = config.actor_rollout_ref.embodied.video_embedding_model_path
    if path in (None, "", "none"):
        return None
    fp16 = config.actor_rollout_ref.embodied.embedding_enable_fp16
    device = "cuda" if torch.cuda.is_available() and \
        config.trainer.device != "cpu" else "cpu"
    key = (str(path), fp16, device)
    if key not in _ENCODERS:
        from siirl.environment.embodied.video_embedding import build_video_encoder

        _ENCODERS[key] = build_video_encoder(str(path), device=device, fp16=fp16)
    return _ENCODERS[key]


def _save_videos(episodes: Sequence[Episode], config: Any, worker: Any) -> Dict[str, float]:
    """Each task's first validation episode as a GIF (rank 0 only); how many were written."""
    folder = config.trainer.default_local_dir
    if not folder or int(getattr(worker, "rank", 0) or 0) != 0:
        return {}
    from siirl.environment.embodied.video import write_video

    step = int(getattr(worker, "global_step", 0) or 0)
    out = Path(str(folder)) / "val_videos" / f"step_{step}"
    written = set()
    for episode in episodes:
        if episode.task in written or not episode.frames:
            continue
        outcome = "success" if episode.success else "failure"
        write_video(episode.frames, out / f"{episode.task}_{outcome}.gif")
        written.add(episode.task)
    return {"val-env/videos": float(len(written))}


def check_settings(config: Any) -> None:
    """What the EMBODIED workflow does not run yet, refused by name before any episode."""
    actor_rollout_ref = config.actor_rollout_ref
    refused = {  # key: (its value, the value supported, why)
        "actor_rollout_ref.rollout.name": (
            actor_rollout_ref.rollout.name, "hf", "the VLA's images reach the model through "
            "the hf rollout only; vllm/sglang would drop them"),
        "actor_rollout_ref.actor.strategy": (
            actor_rollout_ref.actor.strategy, "fsdp", "the episode log-prob head runs on "
            "FSDP modules; Megatron has no VLA model"),
        "algorithm.adv_estimator": (
            config.algorithm.adv_estimator, "grpo", "episode rows have no critic values: GAE "
            "needs a value head over images, which is not built"),
    }
    for key, (value, wanted, why) in refused.items():
        value = str(value or wanted).lower()
        if key == "algorithm.adv_estimator" and value != "gae":
            continue
        if value != wanted:
            raise ConfigError(f"algorithm.workflow_type=EMBODIED: {key}={value} is not "
                              f"supported ({why}); use {key}={wanted}")


def embodied_rollout(batch: Any, config: Any = None, worker: Any = None,
                     validate: bool = False, **_: Any) -> NodeOutput:
    """Node function: episodes for the prompt rows of ``batch`` -> one row per episode."""
    check_settings(config)
    rollout, actor = worker.engines.rollout, worker.engines.actor
    tokenizer = actor.tokenizer
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    module_config = getattr(rollout.policy()[0], "config", None) \
        if hasattr(rollout, "policy") else None
    image_tokens = int(getattr(module_config, "image_tokens", 0) or 0)
    if image_tokens <= 0:
        raise ConfigError(
            f"algorithm.workflow_type=EMBODIED needs a vision-language-action model; "
            f"actor_rollout_ref.model.path={config.actor_rollout_ref.model.path!r} "
            "has no image tokens (config.image_tokens). Use builtin:tiny-vla or a model "
            "whose forward takes pixel_values and proprio")
    bins = int(getattr(module_config, "action_bins", 256) or 256)
    actions = action_tokenizer_for(tokenizer, bins)
    rollout_cfg = config.actor_rollout_ref.rollout
    n = (rollout_cfg.val_kwargs.n if validate else rollout_cfg.n) or 1
    run_seed = config.trainer.seed or 0
    step = -1 if validate else int(getattr(worker, "global_step", 0) or 0)
    sample_ids = [int(i) for i in batch[SAMPLE_ID].tolist()]
    envs = worker_envs(config, len(sample_ids) * n)
    action_dim = int(envs.action_dim)
    token_len = config.actor_rollout_ref.embodied.action_token_len
    if token_len != action_dim:
        raise ConfigError(f"{EMBODIED}.action_token_len={token_len}, but "
                          f"the environment's actions have {action_dim} dimensions: set "
                          f"{EMBODIED}.action_token_len={action_dim}")
    k = config.actor_rollout_ref.embodied.action_chunks_len
    if k < 1:
        raise ConfigError(f"{EMBODIED}.action_chunks_len={k}: a chunk is at least 1 action")
    chunks = -(-int(envs.max_steps) // k)
    remap = env_action_map(config, action_dim)
    tasks = list(envs.task_ids)
    episodes = []
    prompts: Dict[str, List[int]] = {}
    for sample_id in sample_ids:
        task = tasks[sample_id % len(tasks)]
        seed = episode_seed(run_seed, sample_id, step)
        for j in range(n):
            episodes.append(Episode(task=task, seed=seed, group=str(sample_id),
                                    key=episode_key(sample_id, n, j), prompt=None,
                                    tokens=[], images=[], proprios=[], reward=0.0,
                                    success=False, done=False, error=None, frames=[]))

    def act(playing: List[Episode], observations: List[dict], record: bool = True
            ) -> np.ndarray:
        for episode, observation in zip(playing, observations, strict=True):
            if episode.prompt is None:
                instruction = observation["instruction"]
                if instruction not in prompts:
                    prompts[instruction] = vla_prompt_ids(tokenizer, instruction, image_tokens)
                episode.prompt = prompts[instruction]
        images = np.stack([o["image"] for o in observations])
        proprio = np.stack([o["proprio"] for o in observations])
        fields = left_padded([e.prompt for e in playing], pad_id)
        fields.update({PIXEL_VALUES: torch.from_numpy(np.ascontiguousarray(images)),
                       PROPRIO: torch.from_numpy(np.ascontiguousarray(proprio,
                                                                      dtype=np.float32))})
        out = policy.generate(fields, [e.key for e in playing])
        tokens = out[RESPONSES].numpy()
        chunk = np.stack([actions.chunk(t, action_dim) for t in tokens])
        if remap is not None:  # the permuted-actions control: the env gets them changed
            chunk = remap(chunk)
        for row, episode in enumerate(playing):
            if record and len(episode.tokens) < chunks:
                episode.tokens.append(tokens[row])
                episode.images.append(images[row])
                episode.proprios.append(proprio[row])
        return chunk

    policy = EnginePolicy(rollout, pad_id, k * action_dim, validate)
    comm = getattr(worker, "comm", None)
    wave = int(envs.num_envs)
    want_video = validate or _video_encoder(config) is not None
    clipped_before = int(getattr(envs, "clipped", 0))
    play(envs, episodes, act, chunks, wave, bool(comm is not None and comm.active),
         want_video)
    out = episode_rows(episodes, pad_id, chunks, k * action_dim)
    metrics = _episode_metrics(episodes, int(getattr(envs, "clipped", 0)) - clipped_before,
                               "val-env" if validate else "env")
    encoder = None if validate else _video_encoder(config)
    if encoder is not None:
        out.set(TRAJECTORY_EMBEDDING, torch.as_tensor(
            encoder.embed([np.stack(e.frames) for e in episodes]), dtype=torch.float32))
    if validate:
        _success_scores(out)
        metrics.update(_save_videos(episodes, config, worker))
    for episode in episodes:
        episode.frames = []
    return NodeOutput(batch=out, metrics=metrics)


def _episode_metrics(episodes: Sequence[Episode], clipped: int, prefix: str
                     ) -> Dict[str, float]:
    count = max(len(episodes), 1)
    metrics = {
        f"{prefix}/success_rate": sum(e.success for e in episodes) / count,
        f"{prefix}/chunks/mean": sum(len(e.tokens) for e in episodes) / count,
        f"{prefix}/reward/mean": sum(e.reward for e in episodes) / count,
        f"{prefix}/episodes": float(len(episodes)),
        f"{prefix}/lost": float(sum(e.error is not None for e in episodes)),
        f"{prefix}/actions_clipped": float(clipped),
    }
    by_task: Dict[str, List[bool]] = {}
    for episode in episodes:
        by_task.setdefault(episode.task, []).append(episode.success)
    for task, results in by_task.items():
        metrics[f"{prefix}/{task}/success_rate"] = sum(results) / len(results)
    return metrics
