"""siiRL's public base classes for a user's own multi-turn tools and interactions
(``...multiturn.tools.base_tool.BaseTool`` with ``tools.schemas.OpenAIFunctionToolSchema``,
``...multiturn.interactions.base.BaseInteraction``): subclasses written as siiRL's own
Gsm8kTool and Gsm8kInteraction are run unchanged in the tool loop, from siiRL's tool and
interaction config files."""

import json
import textwrap

import pytest
import yaml
from test_multi_turn import encoded
from test_trajectory_manager import char_tokenizer

from siirl.environment.multi_turn import ToolLoop
from siirl.environment.multi_turn.interactions import load_interactions
from siirl.environment.tools import load_tools
from siirl.errors import ConfigError
from siirl.execution.rollout_flow.multiturn.interactions.base import BaseInteraction
from siirl.execution.rollout_flow.multiturn.interactions.gsm8k_interaction import (
    Gsm8kInteraction,
)
from siirl.execution.rollout_flow.multiturn.tools.base_tool import BaseTool
from siirl.execution.rollout_flow.multiturn.tools.gsm8k_tool import Gsm8kTool
from siirl.execution.rollout_flow.multiturn.tools.schemas import OpenAIFunctionToolSchema

# the user's module, in siiRL's style (async methods, per-instance dicts, the schema model)
USER_MODULE = textwrap.dedent('''
    from typing import Any, Dict, List, Optional, Tuple
    from uuid import uuid4

    from siirl.execution.rollout_flow.multiturn.interactions.base import BaseInteraction
    from siirl.execution.rollout_flow.multiturn.tools.base_tool import BaseTool
    from siirl.execution.rollout_flow.multiturn.tools.schemas import OpenAIFunctionToolSchema


    class CounterTool(BaseTool):
        """Adds each call's step (times config scale) to the conversation's counter."""

        def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema):
            assert tool_schema.function.name == "count"  # the model, before super()
            super().__init__(config, tool_schema)
            self._instance_dict = {}

        async def create(self, instance_id: Optional[str] = None, start: int = 0,
                         **kwargs) -> str:
            if instance_id is None:
                instance_id = str(uuid4())
            self._instance_dict[instance_id] = {"count": start}
            return instance_id

        async def execute(self, instance_id: str, parameters: dict[str, Any],
                          **kwargs) -> Tuple[str, float, dict]:
            state = self._instance_dict[instance_id]
            state["count"] += int(parameters.get("step", 1)) * self.config["scale"]
            return f"count={state['count']}", 0.1, {}

        async def release(self, instance_id: str, **kwargs) -> None:
            del self._instance_dict[instance_id]


    class KeywordJudge(BaseInteraction):
        """Ends the conversation once the assistant's reply holds the row's keyword."""

        def __init__(self, config: dict):
            super().__init__(config)
            self._instance_dict = {}

        async def start_interaction(self, instance_id: Optional[str] = None,
                                    keyword: Optional[str] = None, **kwargs) -> str:
            if instance_id is None:
                instance_id = str(uuid4())
            self._instance_dict[instance_id] = {"keyword": keyword}
            return instance_id

        async def generate_response(self, instance_id: str, messages: List[Dict[str, Any]],
                                    **kwargs) -> Tuple[bool, str, float, dict]:
            reply = messages[-1].get("content") or ""
            score = await self.calculate_score(instance_id, reply=reply)
            return (True, "Correct.", score, {}) if score else (False, "Again.", score, {})

        async def calculate_score(self, instance_id: str, reply: str = "", **kwargs) -> float:
            return float(self._instance_dict[instance_id]["keyword"] in reply)

        async def finalize_interaction(self, instance_id: str, **kwargs) -> None:
            del self._instance_dict[instance_id]
''')
SCHEMA = {"type": "function", "function": {
    "name": "count", "description": "Add step to the counter.",
    "parameters": {"type": "object", "required": ["step"], "properties": {
        "step": {"type": "integer", "description": "How much to add."}}}}}


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_siirl_tools.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    tools = tmp_path / "tool_config.yaml"
    tools.write_text(yaml.safe_dump({"tools": [{
        "class_name": "my_siirl_tools.CounterTool", "config": {"type": "native", "scale": 2},
        "tool_schema": SCHEMA}]}))
    interactions = tmp_path / "interaction_config.yaml"
    interactions.write_text(yaml.safe_dump({"interaction": [{
        "name": "judge", "class_name": "my_siirl_tools.KeywordJudge", "config": {}}]}))
    return tools, interactions


def _call(step):
    return f"<tool_call>{json.dumps({'name': 'count', 'arguments': {'step': step}})}</tool_call>"


def _tool_text(tokenizer, conversation):
    return tokenizer.decode([t for t, m in zip(conversation.response_ids, conversation.mask,
                                               strict=True) if not m])


def test_a_siirl_style_tool_keeps_one_state_per_conversation(user_module):
    tools = load_tools(str(user_module[0]))
    tool = tools.tools["count"]
    assert isinstance(tool, BaseTool) and tool.config == {"type": "native", "scale": 2}
    assert tools.schemas == [SCHEMA]  # what the chat template shows: the file's schema
    tokenizer = char_tokenizer(True)
    loop = ToolLoop(tokenizer, tools, budget=4000, max_assistant_turns=3)
    rows = [{"tools_kwargs": {"count": {"create_kwargs": {"start": s}}}} for s in (10, 0)]
    conversations = [loop.start([5, 6], [], None, tools.instances(r)) for r in rows]
    script = {0: iter([_call(1), _call(3), "done"]), 1: iter([_call(5), "done"])}
    active = lambda: [i for i, c in enumerate(conversations) if not c.done]  # noqa: E731
    loop.run(conversations, lambda prompts, room: [encoded(tokenizer, next(script[i]))
                                                   for i in active()])
    assert "count=12" in _tool_text(tokenizer, conversations[0])
    assert "count=18" in _tool_text(tokenizer, conversations[0])
    assert "count=10" in _tool_text(tokenizer, conversations[1])  # its own counter
    assert conversations[0].tool_instances.rewards == [0.1, 0.1]
    for conversation in conversations:
        conversation.tool_instances.close()
    assert tool._instance_dict == {}  # released


def test_a_siirl_style_interaction_ends_the_conversation_on_its_keyword(user_module):
    interactions = load_interactions(str(user_module[1]))
    judge = interactions.by_name["judge"]
    assert isinstance(judge, BaseInteraction) and judge.name == "interaction_agent"
    tokenizer = char_tokenizer(True)
    loop = ToolLoop(tokenizer, load_tools(None), budget=4000, max_user_turns=5)
    session = interactions.session({"interaction_kwargs": {"name": "judge",
                                                           "keyword": "blue"}})
    conversation = loop.start([5, 6], [{"role": "user", "content": "Sky colour?"}], session)
    replies = iter(["red", "It is blue."])
    loop.run([conversation], lambda prompts, room: [encoded(tokenizer, next(replies))])
    assert conversation.turn_scores == [0.0, 1.0] and conversation.user_turns == 2
    session.close()
    assert judge._instance_dict == {}


def test_siirls_own_examples_are_subclasses_of_the_base_classes():
    tool = Gsm8kTool({})  # no tool_schema: its own default, as siiRL's
    assert isinstance(tool, BaseTool) and tool.name == "calc_gsm8k_reward"
    assert isinstance(tool.get_openai_tool_schema(), OpenAIFunctionToolSchema)
    assert isinstance(Gsm8kInteraction({}), BaseInteraction)
    assert Gsm8kInteraction({}).name == "gsm8k"


def test_a_bad_schema_and_a_tool_without_execute_say_what_is_wrong(tmp_path):
    with pytest.raises(ConfigError, match="function.description"):
        BaseTool({}, {"type": "function", "function": {"name": "x", "parameters": {
            "type": "object"}}})
    with pytest.raises(ConfigError, match="no tool_schema"):
        BaseTool({}, None)
    # a tool that implements nothing answers the model with the error, never ends the run
    config = tmp_path / "tools.yaml"
    config.write_text(yaml.safe_dump({"tools": [{
        "class_name": "siirl.execution.rollout_flow.multiturn.tools.base_tool.BaseTool",
        "config": {}, "tool_schema": SCHEMA}]}))
    tools = load_tools(str(config))
    tokenizer = char_tokenizer(True)
    loop = ToolLoop(tokenizer, tools, budget=4000, max_assistant_turns=2)
    conversation = loop.start([5, 6], [], None, tools.instances(None))
    replies = iter([_call(1), "done"])
    loop.run([conversation], lambda prompts, room: [encoded(tokenizer, next(replies))])
    assert "NotImplementedError" in _tool_text(tokenizer, conversation)
