"""The batch field table (siirl.data_coordinator.fields): well-formed, and the real names.

The last test runs one real GRPO step (built-in model and task, CPU) and compares the
fields of the batch that reaches actor_train with the table.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from siirl.data_coordinator import fields

HERE = Path(__file__).parent

# What one GRPO step of the built-in job carries into actor_train, by producer.
GRPO_STEP = {
    "dataloader": {fields.INPUT_IDS, fields.ATTENTION_MASK, fields.POSITION_IDS,
                   fields.SAMPLE_ID, fields.RAW_PROMPT, fields.PROMPT_TEXT,
                   fields.DATA_SOURCE, fields.ABILITY, fields.GROUND_TRUTH,
                   fields.EXTRA_INFO, fields.INDEX},
    "rollout": {fields.UID, fields.PROMPTS, fields.RESPONSES, fields.RESPONSE_MASK},
    "reward": {fields.TOKEN_LEVEL_SCORES, fields.TOKEN_LEVEL_REWARDS, fields.SCORE,
               fields.ACC},
    "advantage": {fields.ADVANTAGES, fields.RETURNS},
    "actor": {fields.OLD_LOG_PROBS},
    "reference": {fields.REF_LOG_PROB},
}
NON_TENSOR = {fields.RAW_PROMPT, fields.PROMPT_TEXT, fields.DATA_SOURCE, fields.ABILITY,
              fields.GROUND_TRUTH, fields.EXTRA_INFO, fields.INDEX, fields.UID, fields.SCORE,
              fields.ACC}
# In the table but not in a default GRPO step: who writes them.
OTHER_FIELDS = {
    fields.VALUES: "critic (PPO)",
    fields.OVERLONG_REWARD: "reward with reward_model.overlong_buffer (DAPO)",
    fields.COMPLETE: "embodied rollout",
    fields.ENV_SCORES: "multi-agent rollout",
    fields.TRAJECTORY_EMBEDDING: "SRPO progress reward",
    fields.TASK_ID: "embodied rollout",
    fields.PIXEL_VALUES: "embodied rollout (a VLA's camera images)",
    fields.PROPRIO: "embodied rollout (a VLA's robot state)",
    fields.ROLLOUT_LOG_PROBS: "the vllm rollout",
    fields.REWARD_MODEL: "a custom loader keeping verl's nested layout",
    fields.REWARD_BASELINES: "remax (the greedy baseline's score)",
    fields.ROUTED_EXPERTS: "the megatron actor's old-log-prob pass with router replay R2",
    fields.POLICY_VERSION: "asynchronous training's rollout worker",
    fields.TOKEN_POLICY_VERSION: "the hf rollout with a pause hook (partial rollouts)",
}


def table() -> dict:
    return {name: value for name, value in vars(fields).items() if name.isupper()}


def test_constants_are_unique_nonempty_strings_named_after_their_value():
    names = table()
    assert names, "no constants found"
    for name, value in names.items():
        assert isinstance(value, str) and value, name
        # one rule, so the table reads at a glance: the constant is its value upper-cased
        assert name == value.upper(), (name, value)
    values = list(names.values())
    assert len(values) == len(set(values)), "two constants share a value"


def test_table_is_the_grpo_step_plus_the_documented_others():
    grpo = set().union(*GRPO_STEP.values())
    assert grpo.isdisjoint(OTHER_FIELDS)
    assert set(table().values()) == grpo | set(OTHER_FIELDS)


@pytest.mark.slow
def test_one_grpo_step_carries_exactly_these_fields(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.run(
        [sys.executable, "-m", "siirl.main_dag", f"trainer.default_local_dir={tmp_path}",
         "dag.custom_pipeline_fn=siirl_fields_pipeline:grpo_with_recorder",
         "trainer.total_training_steps=1", "trainer.val_before_train=false",
         "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.logger=[]",
         "data.train_batch_size=4", "actor_rollout_ref.rollout.n=2",
         "actor_rollout_ref.actor.ppo_mini_batch_size=4",
         "actor_rollout_ref.actor.use_kl_loss=true",  # else the reference node is skipped
         # two epochs: off-policy, so old_log_probs is a batch field (on-policy the update
         # takes them from its own first forward)
         "actor_rollout_ref.actor.ppo_epochs=2"],
        capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    recorded = json.loads((tmp_path / "batch_fields.json").read_text())
    assert set(recorded) == set().union(*GRPO_STEP.values())
    assert {k for k, kind in recorded.items() if kind == "non-tensor"} == NON_TENSOR
