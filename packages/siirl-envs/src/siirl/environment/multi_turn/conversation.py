"""The tool-calling loop of a multi-turn rollout, for a batch of conversations at once.

Each conversation keeps one token list: the prompt, then per turn the assistant's reply
(``mask`` 1, trained on) and, when the reply calls tools, their results as the chat
template's tool turn (``mask`` 0, never trained on), the template's own tokens included.
A reply without a tool call ends the conversation, unless an interaction (a simulated
user, ``interaction_config_path``) answers it with a user turn (``mask`` 0). A
conversation also ends after ``max_assistant_turns`` replies, ``max_user_turns``
interaction turns, or when the next turn would pass the response budget (the whole
multi-turn response fits in ``data.max_response_length`` tokens).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

from siirl.environment.agentic.trajectory import Formatter
from siirl.environment.tools.parsing import ToolCall, check_format, parse_tool_calls
from siirl.environment.tools.registry import ToolSet

# policy(prompts: token-id lists, max_new_tokens) -> one reply (token ids) per prompt
Policy = Callable[[List[List[int]], int], List[List[int]]]


@dataclass
class Conversation:
    ids: List[int]
    prompt_length: int
    messages: List[Dict[str, Any]] = field(default_factory=list)  # for interactions
    mask: List[int] = field(default_factory=list)  # per token after the prompt
    interaction: Any = None  # a started interaction (``interactions.Session``), or None
    tool_instances: Any = None  # its stateful tools' instances (``tools.instances``), or None
    assistant_turns: int = 0
    user_turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    turn_scores: List[float] = field(default_factory=list)  # from the interaction
    done: bool = False

    @property
    def response_ids(self) -> List[int]:
        return self.ids[self.prompt_length:]


class ToolLoop:
    def __init__(self, tokenizer: Any, tools: ToolSet, budget: int, fmt: str = "hermes",
                 max_assistant_turns: Optional[int] = None,
                 max_user_turns: Optional[int] = None, max_parallel_calls: int = 1,
                 tool_threads: int = 4):
        self.tokenizer, self.tools = tokenizer, tools
        self.formatter = Formatter(tokenizer)
        self.budget = int(budget)
        self.fmt = check_format(fmt)
        self.max_assistant = int(max_assistant_turns) if max_assistant_turns else None
        self.max_user = int(max_user_turns) if max_user_turns is not None else None
        self.max_parallel = max(1, int(max_parallel_calls or 1))
        self.threads = int(tool_threads)

    def start(self, prompt_ids: Sequence[int], messages: Sequence[Dict[str, Any]] = (),
              interaction: Any = None, tool_instances: Any = None) -> Conversation:
        ids = [int(t) for t in prompt_ids]
        return Conversation(ids=ids, prompt_length=len(ids),
                            messages=[dict(m) for m in messages], interaction=interaction,
                            tool_instances=tool_instances)

    def room(self, conversation: Conversation) -> int:
        return self.budget - len(conversation.response_ids)

    def run(self, conversations: Sequence[Conversation], policy: Policy,
            peers: Optional[Callable[[Any], List[Any]]] = None,
            idle: Optional[Callable[[], None]] = None) -> None:
        """Play every conversation to its end on the shared episode runner: one policy call
        per turn for all active ones, then all their tool calls together. With ``peers``
        (the workers' all-gather) a worker whose conversations have ended calls ``idle()``
        on each turn another still plays, so collective rollout calls pair up."""
        from siirl.execution.rollout_flow.episode_runner import EpisodeRunner

        def start(indices: List[int], _slots: List[int]) -> List[Conversation]:
            started = [conversations[i] for i in indices]
            for conversation in started:
                conversation.done = conversation.done or self.room(conversation) <= 0
            return started

        def act(active: List[Conversation], _slots: List[int], _turn: int) -> list:
            replies = policy([list(c.ids) for c in active], max(self.room(c) for c in active))
            pending = []  # (conversation, its tool calls)
            for conversation, reply in zip(active, replies, strict=True):
                calls = self._reply(conversation, list(reply))
                if calls:
                    pending.append((conversation, calls))
            return pending

        def call_tools(owners: List[Conversation], calls: List[List[ToolCall]], _slots: list
                       ) -> list:
            flat = [call for turn_calls in calls for call in turn_calls]
            instances = [c.tool_instances for c, turn_calls in zip(owners, calls, strict=True)
                         for _ in turn_calls]
            results = iter(self.tools.call_many(flat, self.threads, instances))
            return [(turn_calls, [next(results) for _ in turn_calls]) for turn_calls in calls]

        def observe(conversation: Conversation, result: tuple) -> None:
            calls, texts = result
            conversation.tool_calls += len(calls)
            conversation.tool_errors += sum(t.startswith("error:") for t in texts)
            self._tool_turn(conversation, calls, texts)

        EpisodeRunner().run(len(conversations), start, act, step=call_tools, observe=observe,
                            peers=peers, idle=None if idle is None else lambda _: idle())

    def _reply(self, conversation: Conversation, reply: List[int]) -> List[ToolCall]:
        """Record the reply; the tool calls to run for it (none: the turn ends here)."""
        reply = reply[:max(self.room(conversation), 0)]
        conversation.ids += reply
        conversation.mask += [1] * len(reply)
        conversation.assistant_turns += 1
        text = self.tokenizer.decode(reply, skip_special_tokens=True)
        conversation.messages.append({"role": "assistant", "content": text})
        if self.room(conversation) <= 0 or (
                self.max_assistant is not None and
                conversation.assistant_turns >= self.max_assistant):
            conversation.done = True
            return []
        calls = parse_tool_calls(text, self.fmt) if self.tools.tools else []
        if not calls:
            self._user_turn(conversation)
            return []
        for k in range(self.max_parallel, len(calls)):  # verl runs the first few only
            calls[k] = ToolCall(calls[k].name, error=f"not run: at most {self.max_parallel} "
                                                     "tool call(s) per turn")
        return calls

    def _tool_turn(self, conversation: Conversation, calls: List[ToolCall],
                   texts: List[str]) -> None:
        messages = [{"role": "tool", "name": call.name, "content": text}
                    for call, text in zip(calls, texts, strict=True)]
        conversation.messages += messages
        self._append(conversation, self._tool_segment(messages))

    def _user_turn(self, conversation: Conversation) -> None:
        """A reply without a tool call: the interaction's answer, or the end."""
        session = conversation.interaction
        if session is None or (self.max_user is not None and
                               conversation.user_turns >= self.max_user):
            conversation.done = True
            return
        conversation.user_turns += 1
        stop, text, score = session.respond(conversation.messages)
        conversation.turn_scores.append(float(score))
        if stop:
            conversation.done = True
            return
        message = {"role": "user", "content": text}
        conversation.messages.append(message)
        self._append(conversation, self.formatter.observation([message]))

    def _tool_segment(self, messages: List[Dict[str, Any]]) -> List[int]:
        """Tool results in the chat template's tool turn; a template that cannot render
        the tool role (or no template) gets them as a user turn in hermes' tags."""
        if self.formatter.chat:
            try:
                return self.formatter.observation(messages)
            except Exception:  # a template without the tool role
                pass
        wrapped = [{"role": "user", "content": f"<tool_response>\n{m['content']}\n"
                                               "</tool_response>"} for m in messages]
        return self.formatter.observation(wrapped)

    def _append(self, conversation: Conversation, segment: List[int]) -> None:
        """Append a turn the model does not write; end the conversation when it and a
        reply would not fit."""
        if len(segment) >= self.room(conversation):
            conversation.done = True
            return
        conversation.ids += segment
        conversation.mask += [0] * len(segment)

    @staticmethod
    def metrics(conversations: Sequence[Conversation]) -> Dict[str, float]:
        count = max(len(conversations), 1)
        out = {
            "multi_turn/assistant_turns/mean":
                sum(c.assistant_turns for c in conversations) / count,
            "multi_turn/tool_calls/mean": sum(c.tool_calls for c in conversations) / count,
            "multi_turn/tool_errors": float(sum(c.tool_errors for c in conversations)),
        }
        if any(c.interaction is not None for c in conversations):
            out["multi_turn/user_turns/mean"] = sum(c.user_turns for c in conversations) / count
        return out
