"""The trajectory-level env manager: a whole multi-turn episode is one training sample.

Each episode keeps one token list, the source of truth for both generation and training:
the first prompt (the environment's instructions and first observation, through the chat
template when the tokenizer has one), then for each turn the agent's generated tokens
(``mask`` 1: trained on) followed by the environment's reply (``mask`` 0: the observation
in the chat template's user turn, never trained on). The next turn's prompt is the list so
far, so the policy is trained on exactly the tokens it saw and produced.

Per turn the agent's reply is parsed by the environment (:meth:`TextEnv.parse_action`); a
reply with no action costs ``format_penalty`` and is answered with a format hint. An
environment that raises, returns something malformed (a non-numeric or non-finite reward),
or (in a worker process, ``env_workers``) hangs or dies ends its episode with
``error_penalty``, counted by kind and warned about once. An episode ends when the
environment says so, after ``max_actions_per_traj`` turns, or when its tokens would pass
``max_episode_tokens``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

from siirl.data_coordinator.dataloader.partitioned_dataset import encode_text, render_prompt
from siirl.environment.base import TextEnv
from siirl.environment.text_controls import said_to_env
from siirl.errors import PluginNotFoundError

FORMAT_HINT = "Invalid format: {instructions}"

# policy(prompts: token-id lists) -> one generated token-id list per prompt
Policy = Callable[[List[List[int]]], List[List[int]]]


@dataclass
class Episode:
    env: TextEnv
    seed: int
    group: str  # episodes of one group start from the same seed (GRPO's uid)
    tag: str = ""
    key: int = 0  # the noise key of its replies (a rerun replays the episode)
    ids: List[int] = field(default_factory=list)
    mask: List[int] = field(default_factory=list)  # per token after the prompt
    prompt_length: int = 0
    reward: float = 0.0
    turns: int = 0
    format_errors: int = 0
    success: bool = False
    done: bool = False
    error: Optional[str] = None  # the kind of environment failure that ended it
    final_render: Optional[str] = None  # the environment's render() at the end (validation)
    # custom_envs.<tag>.action_words (a control): said word -> the environment's action
    action_words: Optional[Dict[str, str]] = None
    # per turn: where the reply sits in ``ids`` and the reward that followed it
    turn_spans: List[tuple] = field(default_factory=list)
    turn_rewards: List[float] = field(default_factory=list)

    def add_reward(self, value: float) -> None:
        """Reward for the latest turn (before the first turn: counted in the total only)."""
        self.reward += value
        if self.turn_rewards:
            self.turn_rewards[-1] += value

    @property
    def response_ids(self) -> List[int]:
        return self.ids[self.prompt_length:]


class Formatter:
    """Token ids of the first prompt and of each observation, in the tokenizer's chat
    format (or plain lines for a tokenizer without a chat template)."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.chat = bool(getattr(tokenizer, "chat_template", None))

    def first_prompt(self, instructions: str, observation: Any) -> List[int]:
        messages = [{"role": "system", "content": instructions}] if instructions else []
        messages += _as_messages(observation)
        return encode_text(self.tokenizer, render_prompt(self.tokenizer, messages))

    def observation(self, observation: Any) -> List[int]:
        """The environment's turn after an agent reply, ending with the generation prompt."""
        messages = _as_messages(observation)
        if not self.chat:
            return encode_text(self.tokenizer, "\n" + "\n".join(
                m["content"] for m in messages) + "\n")
        before = [{"role": "user", "content": "."}, {"role": "assistant", "content": "."}]
        base = self.tokenizer.apply_chat_template(before, tokenize=False)
        full = self.tokenizer.apply_chat_template(before + messages, tokenize=False,
                                                  add_generation_prompt=True)
        suffix = full[len(base):] if full.startswith(base) else render_prompt(
            self.tokenizer, messages)
        return encode_text(self.tokenizer, suffix)


def _as_messages(observation: Any) -> List[Dict[str, str]]:
    if isinstance(observation, str):
        return [{"role": "user", "content": observation}]
    return [dict(m) for m in observation]


class TrajectoryEnvManager:
    def __init__(self, tokenizer: Any, max_actions_per_traj: int = 10,
                 max_episode_tokens: int = 1024, format_penalty: float = -0.1,
                 error_penalty: float = -1.0):
        self.formatter = Formatter(tokenizer)
        self.tokenizer = tokenizer
        self.max_actions = int(max_actions_per_traj)
        self.max_tokens = int(max_episode_tokens)
        self.format_penalty, self.error_penalty = float(format_penalty), float(error_penalty)
        self.errors: Dict[str, int] = {}
        self._warned: set = set()

    # -- episodes -------------------------------------------------------------------------
    def start(self, env: TextEnv, seed: int, group: str, tag: str = "", key: int = 0
              ) -> Episode:
        episode = Episode(env=env, seed=int(seed), group=str(group), tag=tag, key=int(key))
        try:
            observation = env.reset(seed=int(seed))
        except PluginNotFoundError:
            raise  # a missing extra fails every episode: stop with its install hint
        except Exception as exc:
            self._fail(episode, getattr(exc, "kind", "reset"), exc)
            observation = ""
        episode.ids = self.formatter.first_prompt(env.instructions, observation)
        episode.prompt_length = len(episode.ids)
        return episode

    def run(self, episodes: Sequence[Episode], policy: Policy) -> None:
        """Play every episode to its end: one policy call per turn for all active ones,
        then all their environments step together (remote ones in parallel)."""
        self.run_scheduled([lambda e=e: e for e in episodes], policy)

    def run_scheduled(self, starts: Sequence[Callable[[], Episode]], policy: Policy,
                      max_in_flight: int = 0,
                      finished: Optional[Callable[[Episode], None]] = None,
                      peers: Optional[Callable[[Any], List[Any]]] = None) -> List[Episode]:
        """ROLL's rollout scheduler on the shared episode runner: start the episodes
        (``starts[i]()`` makes and resets the environment) as room frees up, at most
        ``max_in_flight`` at once (0: all), so at most that many environments exist;
        ``finished(episode)`` is called as each ends. Returns the episodes in the order of
        ``starts``. With ``peers`` (the workers' all-gather) every worker calls the policy
        on each turn any of them plays, on a one-token prompt once its own episodes have
        ended, so rollout calls that are collective pair up."""
        from siirl.environment.agentic.env_workers import step_many
        from siirl.execution.rollout_flow.episode_runner import EpisodeRunner

        def act(active: List[Episode], _slots: List[int], _turn: int) -> List[tuple]:
            prompts = [list(e.ids) for e in active]
            # a keyed policy (the rollout engine's) seeds each reply by its episode
            replies = policy(prompts, [e.key for e in active]) \
                if getattr(policy, "keyed", False) else policy(prompts)
            acting = []  # (episode, action) of the replies with a parsable action
            for episode, reply in zip(active, replies, strict=True):
                action = self._reply(episode, list(reply))
                if action is not None:
                    acting.append((episode, action))
            return acting

        return EpisodeRunner(max_in_flight).run(
            len(starts), lambda indices, _slots: [starts[i]() for i in indices], act,
            step=lambda episodes, actions, _slots: step_many([e.env for e in episodes],
                                                             actions),
            observe=self._stepped, finished=finished, peers=peers,
            idle=None if peers is None else lambda _: self._idle_call(policy))

    def _idle_call(self, policy: Policy) -> None:
        token = self.tokenizer.pad_token_id
        prompt = [[int(self.tokenizer.eos_token_id if token is None else token)]]
        if getattr(policy, "keyed", False):
            policy(prompt, [0])
        else:
            policy(prompt)

    def _reply(self, episode: Episode, reply: List[int]) -> Optional[str]:
        """Record the agent's reply; its action, or None after a format error (answered
        with the format hint)."""
        episode.turn_spans.append((len(episode.ids), len(episode.ids) + len(reply)))
        episode.turn_rewards.append(0.0)
        episode.ids += reply
        episode.mask += [1] * len(reply)
        episode.turns += 1
        text = self.tokenizer.decode(reply, skip_special_tokens=True)
        action = episode.env.parse_action(text)
        if action is not None:
            action = said_to_env(episode.action_words, action)
        if action is None:
            episode.format_errors += 1
            episode.add_reward(self.format_penalty)
            self._observe(episode, FORMAT_HINT.format(instructions=episode.env.instructions),
                          False)
        return action

    def _stepped(self, episode: Episode, result: Any) -> None:
        if isinstance(result, BaseException):
            self._fail(episode, getattr(result, "kind", "step"), result)
            return
        try:
            observation, reward, done, info = result
            reward = float(reward)
        except (TypeError, ValueError) as exc:
            self._fail(episode, "malformed", ValueError(
                f"step() returned {str(result)[:200]!r}, not (observation, reward, done, "
                f"info) with a numeric reward ({exc})"))
            return
        if reward != reward or abs(reward) == float("inf"):
            self._fail(episode, "malformed", ValueError(f"reward {reward} is not finite"))
            return
        episode.add_reward(reward)
        episode.success = bool((info or {}).get("success", False))
        self._observe(episode, observation, bool(done))

    def _observe(self, episode: Episode, observation: Any, done: bool) -> None:
        """End the episode, or append the environment's reply for the next turn."""
        if done or episode.turns >= self.max_actions:
            episode.done = True
            return
        segment = self.formatter.observation(observation)
        if len(episode.ids) + len(segment) >= self.max_tokens:
            episode.done = True  # no room for the observation and another reply
            return
        episode.ids += segment
        episode.mask += [0] * len(segment)

    def _fail(self, episode: Episode, kind: str, exc: BaseException) -> None:
        episode.error, episode.done = kind, True
        episode.add_reward(self.error_penalty)
        self.errors[kind] = self.errors.get(kind, 0) + 1
        if kind not in self._warned:
            self._warned.add(kind)
            name = type(getattr(episode.env, "local", episode.env)).__name__
            print(f"[siirl] environment {name} failed ({kind}, seed {episode.seed}): "
                  f"{type(exc).__name__}: {exc}; the episode ends "
                  f"with reward {self.error_penalty:g} (counted in env/errors/{kind}; "
                  "further failures are only counted)", file=sys.stderr, flush=True)

    # -- metrics --------------------------------------------------------------------------
    def metrics(self, episodes: Sequence[Episode], prefix: str = "env") -> Dict[str, float]:
        """Success rate, score mean/max/min, turns and format errors, overall and per tag;
        failures by kind."""
        out: Dict[str, float] = {}
        tags = sorted({e.tag for e in episodes if e.tag})
        for tag in [""] + tags:
            chosen = [e for e in episodes if not tag or e.tag == tag]
            if not chosen:
                continue
            name = f"{prefix}/{tag}" if tag else prefix
            scores = [e.reward for e in chosen]
            out[f"{name}/success_rate"] = sum(e.success for e in chosen) / len(chosen)
            out[f"{name}/score/mean"] = sum(scores) / len(scores)
            out[f"{name}/score/max"] = max(scores)
            out[f"{name}/score/min"] = min(scores)
            out[f"{name}/turns/mean"] = sum(e.turns for e in chosen) / len(chosen)
            out[f"{name}/format_errors"] = float(sum(e.format_errors for e in chosen))
        for kind, count in self.errors.items():
            out[f"{prefix}/errors/{kind}"] = float(count)
        return out
