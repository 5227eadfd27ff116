"""The names of the batch fields that nodes exchange: one table, imported instead of literals.

A batch is one ``TensorDict`` with ``batch_size=[B]`` (see ``protocol``). Shapes below use
B rows (after the rollout: prompts x ``rollout.n``), P the padded prompt width, R the
response width (``data.max_response_length``) and T = P + R. "non-tensor" fields hold one
python value per row. Each line says which node (or module) writes the field.

The values are verl's names, so a verl-style custom node or reward function keeps working.
The columns of a dataset *file* (``prompt``, ``reward_model`` ...; see
``dataloader.partitioned_dataset``) are a file format, not batch fields, except where a
column is carried into the batch under the same name.
"""

from __future__ import annotations

# --- dataloader (siirl.data_coordinator.dataloader): one row per prompt ---------------
INPUT_IDS = "input_ids"  # long [B, P] left-padded prompt; after rollout [B, T] prompt+response
ATTENTION_MASK = "attention_mask"  # long [B, P], 1 on real tokens; after rollout [B, T]
POSITION_IDS = "position_ids"  # long [B, P], cumsum(mask) - 1, pads at 0; after rollout [B, T]
SAMPLE_ID = "sample_id"  # long [B], epoch * len(dataset) + position: unique over the run
RAW_PROMPT = "raw_prompt"  # non-tensor: the prompt's chat messages [{role, content}, ...]
PROMPT_TEXT = "prompt_text"  # non-tensor str: the prompt rendered by the chat template
DATA_SOURCE = "data_source"  # non-tensor str: which dataset/rule scores the row
ABILITY = "ability"  # non-tensor str: the dataset's task category (e.g. "math")
GROUND_TRUTH = "ground_truth"  # non-tensor: the reference answer (reward_model.ground_truth)
EXTRA_INFO = "extra_info"  # non-tensor dict: the row's free-form extra_info
INDEX = "index"  # non-tensor int: the row's position in the dataset files
REWARD_MODEL = "reward_model"  # non-tensor dict {ground_truth, ...}: verl's layout, when a
#                                custom loader keeps it; read if GROUND_TRUTH is absent

# --- rollout (MODEL_INFERENCE / ROLLOUT): n rows per prompt ---------------------------
# long [B]: the weight version (trainer step) of the policy that generated the row
# (asynchronous training; absent otherwise); with partial rollouts its oldest token's
POLICY_VERSION = "policy_version"
# long [B, R]: the weight version that sampled each response token, -1 on padding (the hf
# rollout with a pause hook: partial rollouts, siirl.engine.rollout.partial_rollout)
TOKEN_POLICY_VERSION = "token_policy_version"
UID = "uid"  # non-tensor str: group id of the n samples of one prompt (str(sample_id))
PROMPTS = "prompts"  # long [B, P]: the prompt part of input_ids
RESPONSES = "responses"  # long [B, R]: generated tokens, pad after EOS
RESPONSE_MASK = "response_mask"  # float32 [B, R], 1 up to and including the first EOS
ROLLOUT_LOG_PROBS = "rollout_log_probs"  # float32 [B, R]: the inference engine's log-probs
#                                          of the sampled tokens (vllm), 0 on padding

# --- reward (COMPUTE / REWARD, siirl.engine.reward_manager) ---------------------------
TOKEN_LEVEL_SCORES = "token_level_scores"  # float32 [B, R]: the score on the last token
TOKEN_LEVEL_REWARDS = "token_level_rewards"  # float32 [B, R]: scores, minus the KL penalty
#                                              when algorithm.use_kl_in_reward (advantage)
SCORE = "score"  # non-tensor float: the scorer's own score (before overlong shaping)
OVERLONG_REWARD = "overlong_reward"  # non-tensor float <= 0: DAPO's overlong penalty
ACC = "acc"  # non-tensor bool: answer correct; an extra key of the built-in scorers
REWARD_BASELINES = "reward_baselines"  # float32 [B]: the score of a greedy response to the
#                                        row's prompt (ReMax; siirl.dag_worker.nodes.remax_baseline)

# --- actor / reference (MODEL_INFERENCE / ACTOR, REFERENCE) ---------------------------
OLD_LOG_PROBS = "old_log_probs"  # float32 [B, R]: log-probs of the rollout policy
REF_LOG_PROB = "ref_log_prob"  # float32 [B, R]: log-probs of the reference policy
# uint8/int16 [B, S, L, k]: the experts each token was routed to in the old-log-prob pass, per
# MoE layer (router replay, mode R2: the update routes through them again)
ROUTED_EXPERTS = "routed_experts"

# --- critic (MODEL_INFERENCE / CRITIC) -------------------------------------------------
VALUES = "values"  # float32 [B, R]: value estimates of the response tokens

# --- advantage (COMPUTE / ADVANTAGE, siirl.dag_worker.nodes.algorithm) ----------------
ADVANTAGES = "advantages"  # float32 [B, R]: per-token advantages
RETURNS = "returns"  # float32 [B, R]: returns (the critic's targets under GAE)

# --- embodied rollout ------------------------------------------------------------------
COMPLETE = "complete"  # 0/1 per episode: task success (embodied sampling's default metric)
ENV_SCORES = "env_scores"  # float32 [B]: the environment's episode score (multi-agent rollout)
TRAJECTORY_EMBEDDING = "trajectory_embedding"  # float32 [B, D]: episode video embedding
TASK_ID = "task_id"  # non-tensor str: the embodied task an episode plays
# a vision-language-action policy's inputs besides the prompt ids: in a rollout batch one
# observation per row, in an episode row one per chunk step ([B, T, ...], zeros past its end)
PIXEL_VALUES = "pixel_values"  # uint8 [B, H, W, 3] or [B, T, H, W, 3]: camera images
PROPRIO = "proprio"  # float32 [B, P] or [B, T, P]: the robot's own state


# the model inputs a rollout or log-prob pass hands to the model when a batch has them
# (lower-case: a tuple of fields, not a field of the table)
model_extra_inputs = (PIXEL_VALUES, PROPRIO)
