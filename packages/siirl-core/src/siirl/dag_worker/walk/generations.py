"""Generations as text, verl's way: ``trainer.rollout_data_dir`` gets each training step's
rows as ``<step>.jsonl``, ``trainer.validation_data_dir`` each validation's, and
``trainer.log_val_generations=N`` prints N validation samples. A line is ``{step, input,
output, score, data_source}`` (and ``agent_group`` in a multi-agent workflow, ``render`` for
an AGENTIC episode's final state); ``output`` is everything after the prompt that the model
read, environment turns included. Several workers write ``<step>.rank<R>.jsonl`` each.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Iterator, List

from siirl.data_coordinator.fields import (
    ATTENTION_MASK,
    DATA_SOURCE,
    PROMPTS,
    RESPONSES,
    TOKEN_LEVEL_SCORES,
)
from siirl.data_coordinator.protocol import get_non_tensor

RENDER = "render"


def _texts(batch: Any, tokenizer: Any) -> Iterator[Dict[str, Any]]:
    prompts, responses = batch[PROMPTS], batch[RESPONSES]
    width = prompts.shape[1]
    attention = batch[ATTENTION_MASK]
    scores = batch[TOKEN_LEVEL_SCORES].sum(dim=-1).tolist() \
        if TOKEN_LEVEL_SCORES in batch.keys() else [None] * len(prompts)
    keys = batch.keys()
    sources = get_non_tensor(batch, DATA_SOURCE) if DATA_SOURCE in keys else \
        [None] * len(prompts)
    renders = get_non_tensor(batch, RENDER) if RENDER in keys else None
    for row in range(len(prompts)):
        seen = attention[row]
        line = {"input": tokenizer.decode(prompts[row][seen[:width].bool()],
                                          skip_special_tokens=True),
                "output": tokenizer.decode(responses[row][seen[width:].bool()],
                                           skip_special_tokens=True),
                "score": scores[row], "data_source": sources[row]}
        if renders is not None:
            line[RENDER] = renders[row]
        yield line


def lines(batch: Any, tokenizer: Any) -> List[Dict[str, Any]]:
    """One dict per row (per agent's row in a multi-agent batch)."""
    if batch is None or tokenizer is None:
        return []
    if RESPONSES in batch.keys():
        return list(_texts(batch, tokenizer))
    from siirl.dag_worker.multi_agent.agent_groups import AgentGroups, agent_field

    found = []
    groups = sorted({owner[0] for key in batch.keys() if (owner := agent_field(key))})
    for group in groups:
        view = AgentGroups.view(batch, group)
        if RESPONSES in view.keys():
            found += [{**line, "agent_group": group} for line in _texts(view, tokenizer)]
    return found


def dump(rows: List[Dict[str, Any]], folder: Any, step: int, rank: int, world: int) -> Path:
    path = Path(str(folder))
    path.mkdir(parents=True, exist_ok=True)
    name = f"{step}.jsonl" if world <= 1 else f"{step}.rank{rank}.jsonl"
    target = path / name
    with target.open("w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps({"step": step, **row}, ensure_ascii=False, default=str) + "\n")
    return target
