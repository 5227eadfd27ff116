"""The key table's rules for the reward sections: ``reward_model`` (sandbox fusion, the reward
keywords), verl's reward loop, and verl's ``reward_manager`` section. ``siirl.params.key_rules``
places ``REWARD_RULES`` in the table. The reward model's own rules (its model, its judge or
sequence classifier) are its section's (``siirl.engine.reward_model.config``)."""

from __future__ import annotations

from typing import Tuple

from siirl.params.key_conditions import ROLLOUT, get
from siirl.params.key_rule_kinds import Rule, notice, refused

REWARD_RULES: Tuple[Rule, ...] = (
    refused("reward_model.sandbox_fusion.url", "serves the multi-turn python tool only",
            "sandbox fusion runs the python tool of multi-turn rollouts "
            "(actor_rollout_ref.rollout.multi_turn.enable=true with a tool config); rewards "
            "do not use it: run code checks in your own custom_reward_function.",
            lambda config, key: not get(config, f"{ROLLOUT}.multi_turn.enable", False)),
    notice("reward_model.sandbox_fusion.*", "no effect without sandbox_fusion.url",
           "it only acts with reward_model.sandbox_fusion.url, for the multi-turn python tool.",
           lambda config, key: not get(config, "reward_model.sandbox_fusion.url") or
           not get(config, f"{ROLLOUT}.multi_turn.enable", False)),
    notice("reward_model.reward_kwargs", "read by the embodied reward manager only",
           "reward_model.reward_kwargs are the embodied manager's keywords (reward_coef); the "
           "other managers take custom_reward_function.reward_kwargs.",
           lambda config, key: get(config, "reward_model.reward_manager") != "embodied"),
    notice("reward_model.launch_reward_fn_async", "no effect: rewards are scored in the step",
           "rewards are scored inside the step; reward_model.reward_manager=parallel scores in "
           "a process pool."),
    # -- verl's reward loop: how verl runs the scoring (its default; every verl reward-model
    #    script sets use_reward_loop)
    notice("reward_model.use_reward_loop", "no effect: one way of scoring",
           "verl switches between its reward loop (asynchronous reward workers, the reward model "
           "served by an inference engine) and its older reward workers; both score the same "
           "rows with the same rules and model. Here the reward node scores each step's rows "
           "with reward_model.reward_manager and, with reward_model.enable, the model at "
           "reward_model.model.path, whichever value this key has."),
    notice("reward_model.num_workers", "no effect unless reward_manager=parallel",
           "reward_model.num_workers is the number of scoring processes of "
           "reward_model.reward_manager=parallel (verl: of its reward-loop workers); the other "
           "managers score the rows one after another.",
           lambda config, key: get(config, "reward_model.reward_manager") != "parallel"),
    refused("reward_model.enable_resource_pool", "the reward model runs on the workers",
            "verl's standalone mode puts the reward model on GPUs of its own "
            "(reward_model.n_gpus_per_node x nnodes); here each worker scores its rows with "
            "its own copy of the reward model (verl's colocated mode): leave it false."),
    notice(("reward_model.n_gpus_per_node", "reward_model.nnodes"), "no effect: no separate pool",
           "they size verl's separate reward-model pool (reward_model.enable_resource_pool, "
           "refused here); the reward model runs on the training workers."),
    notice("reward_model.rollout.*", "no effect: no reward-model server",
           "they configure the inference server verl's reward loop serves the reward model "
           "with; here the reward model runs inside each worker: a sequence classifier's "
           "forward (reward_model.micro_batch_size_per_gpu, max_length) or, with "
           "style=generative, the judge's replies through a rollout engine (judge.*)."),
    refused("reward_model.reward_loop_source", "reward managers are registered plugins",
            "verl's importlib source loads a reward-loop manager class from a file (its "
            "RewardManagerBase, run_single on a DataProto), which cannot run here; choose a "
            "registered manager with reward_model.reward_manager (naive, batch, parallel, "
            "dapo, or a package's siirl.reward_managers entry point) and a scoring function "
            "with custom_reward_function.path, or load a manager class written for this "
            "release from a file with reward_manager.source=importlib "
            "(reward_manager.module.path, reward_manager.name); leave this key at register.",
            lambda config, key: str(get(config, key)) != "register"),
    notice(("reward_model.reward_loop_module_path", "reward_model.reward_loop_class_name"),
           "no effect unless reward_loop_source=importlib",
           "verl reads them with reward_model.reward_loop_source=importlib only (refused here: "
           "reward managers are registered plugins)."),
    # -- verl's reward_manager section: reward_manager.source and .name are read
    #    (siirl.params.aliases, siirl.dag_worker.walk.reward_manager_file)
    notice(("reward_manager.module.path", "reward_manager.module.name"),
           "no effect unless reward_manager.source=importlib",
           "reward_manager.module.* name the file a manager class is loaded from with "
           "reward_manager.source=importlib (as in verl); with source=register, "
           "reward_manager.name picks an installed manager.",
           lambda config, key: get(config, "reward_manager.source") != "importlib"),
    notice("reward_manager.module.name", "no effect with a pkg:// module",
           "a pkg:// module is imported under its own dotted name (as in verl).",
           lambda config, key: str(get(config, "reward_manager.module.path") or "")
           .startswith("pkg://")),
    notice("reward_model.profiler.*", "no effect: one profiler for the step",
           "verl profiles each role on its own; here profiler.enable (profiler.profile_steps, "
           "or verl's trainer.profile_steps) traces whole steps, the reward nodes included."),
    notice("reward_model.overlong_buffer.log", "no effect: no separate overlong metrics",
           "the overlong penalty is applied but not logged as separate metrics."),
)
