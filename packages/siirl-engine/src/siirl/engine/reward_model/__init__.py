"""Model-based rewards (engine role ``reward_model``, ``reward_model.enable=true``).

``engine``: a sequence-classification reward model (``reward_model.style=discriminative``);
``judge``: an LLM asked for a grade (``generative``); ``inputs``: what they read of a rollout
batch; ``loading``: ``reward_model.model.path`` (``builtin:tiny-reward``); ``combine``: how
a reward manager adds ``reward_model.rm_weight`` times their ``rm_scores`` to the rule
scores; ``factory``: building the engine (``fsdp_reward_model``). Nothing is imported here,
so the reward managers can import ``combine`` without loading transformers.
"""
