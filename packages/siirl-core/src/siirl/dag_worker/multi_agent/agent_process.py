"""An agent's hooks, loaded from the files its rollout node names (siiRL's conventions).

``agent_options.process_path`` is a Python file with

* ``pre_process(tokenizer, prompt_id, obs, **pre_process_kwargs) -> list[int]``: the token
  ids the agent's model reads, from the episode's text so far (``prompt_id``) and, with
  ``obs_with_env``, the environment's latest observation for this agent (None before the
  first step);
* ``post_process(tokenizer, prompt_id, response_id, **post_process_kwargs) -> list[int]``:
  the episode's text after the agent's reply, which the next agent reads.

Without a process file the agent reads the episode's text as it is and appends its reply.
``agent_options.env_path`` is ``["file.py:ClassName"]``: a class built once per episode
(``Class()``, then ``reset()`` if it has one) whose ``step(actions, ground_truth)`` (plain or
``async``) gets the text each agent produced this turn, in acting order, and returns
``(next_obs, score, done)``: one observation per agent (the last one continues the episode),
the episode's score so far, and whether it ended.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, List, Optional

from siirl.errors import PipelineError
from siirl.user_file import UserFile, load_from_file


def token_ids(result: Any) -> List[int]:
    """A hook's token ids: a list, or the mapping transformers 5's
    ``apply_chat_template(tokenize=True)`` returns (siiRL's process files return that as is,
    written when it returned a list)."""
    if hasattr(result, "keys") and "input_ids" in result.keys():
        result = result["input_ids"]
    return [int(t) for t in result]


def load_attr(ref: str, where: str, kind: str, default_name: Optional[str] = None) -> Any:
    """``"file.py:Name"`` (or ``"file.py"`` with ``default_name``) -> the object, a ``kind``
    ("function", "class") that the file ``where`` names defines."""
    path, _, name = str(ref).rpartition(":") if ":" in str(ref) else (str(ref), "", "")
    name = name or default_name
    if not name:
        raise PipelineError(f"{where}: '{ref}' must be 'file.py:Name'")
    return load_from_file(path, name, UserFile(key=where, prefix="siirl_agent_", kind=kind,
                                               error=PipelineError))


class AgentProcess:
    """One agent's prompt shaping, hand-over and (optional) environment class."""

    def __init__(self, node: Any):
        options = node.agent_options or {}
        where = f"node '{node.node_id}' agent_options"
        self.node_id = node.node_id
        self.group = node.agent_group
        self.obs_with_env = bool(options.get("obs_with_env", False))
        self.pre_kwargs = dict(options.get("pre_process_kwargs") or {})
        self.post_kwargs = dict(options.get("post_process_kwargs") or {})
        self._pre: Optional[Callable] = None
        self._post: Optional[Callable] = None
        if options.get("process_path"):
            path = options["process_path"]
            self._pre = load_attr(f"{path}:pre_process", f"{where}.process_path", "function")
            self._post = load_attr(f"{path}:post_process", f"{where}.process_path", "function")
        envs = options.get("env_path") or []
        envs = [envs] if isinstance(envs, str) else list(envs)
        if len(envs) > 1:
            raise PipelineError(f"{where}.env_path: one environment per agent is supported, "
                                f"got {len(envs)}")
        self.env_class = load_attr(envs[0], f"{where}.env_path", "class") if envs else None

    def pre(self, tokenizer: Any, prompt_ids: List[int], obs: Any) -> List[int]:
        if self._pre is None:
            return list(prompt_ids)
        return token_ids(self._pre(tokenizer, list(prompt_ids),
                                   obs if self.obs_with_env else None, **self.pre_kwargs))

    def post(self, tokenizer: Any, prompt_ids: List[int], response_ids: List[int]) -> List[int]:
        if self._post is None:
            return list(prompt_ids) + list(response_ids)
        return token_ids(self._post(tokenizer, list(prompt_ids), list(response_ids),
                                    **self.post_kwargs))

    def new_env(self) -> Any:
        env = self.env_class()
        if hasattr(env, "reset"):
            env.reset()
        return env


async def step_env(env: Any, actions: List[str], ground_truth: Any) -> tuple:
    result = env.step(actions=actions, ground_truth=ground_truth)
    if inspect.isawaitable(result):
        result = await result
    return result
