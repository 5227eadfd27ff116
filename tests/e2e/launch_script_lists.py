"""More real launch scripts' override lines, for test_launch_scripts.py (same shrinking:
sizes small, data and model paths dropped, hardware keys translated by its SHRINK).

verl (volcengine/verl at b178a3c): examples/ppo_trainer/run_qwen2-7b_rm.sh (reward model,
its reward-loop keys), examples/grpo_trainer/run_qwen2_5-3b_gsm8k_grpo_lora.sh,
examples/ppo_trainer/run_qwen2-7b_seq_balance.sh, examples/rloo_trainer/run_qwen2-7b.sh,
examples/reinforce_plus_plus_trainer/run_qwen2-7b_math_rf.sh,
examples/gpg_trainer/run_qwen2-7b_math.sh, examples/remax_trainer/run_qwen2.5-3b_seq_balance.sh,
examples/ppo_trainer/run_deepseek7b_llm_sp2.sh (Ulysses, 2 workers); siiRL
(sii-research/siiRL at af00a77): examples/cpgd_trainer/run_qwen2_5-7b.sh.
"""

B, MINI, MICRO, N, P, R = 8, 8, 4, 4, 256, 8
TOKENS = (P + R) * 2  # a token budget that holds two rows

VERL_RM = [  # examples/ppo_trainer/run_qwen2-7b_rm.sh
    "algorithm.adv_estimator=gae", f"data.train_batch_size={B}",
    "data.filter_overlong_prompts=True", "data.truncation='error'", "data.return_raw_chat=True",
    "actor_rollout_ref.actor.optim.lr=1e-6", "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.1",
    f"actor_rollout_ref.actor.ppo_mini_batch_size={MINI}",
    f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={MICRO}",
    "actor_rollout_ref.actor.use_kl_loss=False",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={MICRO}",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6", "critic.optim.lr=1e-5",
    "critic.model.use_remove_padding=True", "critic.optim.lr_warmup_steps_ratio=0.05",
    "critic.model.enable_gradient_checkpointing=True",
    f"critic.ppo_micro_batch_size_per_gpu={MICRO}", "critic.model.fsdp_config.param_offload=False",
    "critic.model.fsdp_config.optimizer_offload=False", "reward_model.enable=True",
    "reward_model.model.path=builtin:tiny-reward", "reward_model.use_reward_loop=True",
    "reward_model.rollout.name=vllm", "reward_model.rollout.gpu_memory_utilization=0.8",
    "reward_model.rollout.tensor_model_parallel_size=1",
    "reward_model.rollout.prompt_length=2048", "reward_model.rollout.response_length=1024",
    "reward_model.num_workers=8", "algorithm.use_kl_in_reward=False", "trainer.critic_warmup=0",
    "trainer.project_name='verl_example'",
    "trainer.experiment_name='Qwen2-7B-Instruct_hybrid_rm'", "trainer.total_epochs=15"]

VERL_LORA = [  # examples/grpo_trainer/run_qwen2_5-3b_gsm8k_grpo_lora.sh
    "algorithm.adv_estimator=grpo", f"data.train_batch_size={B}",
    "data.filter_overlong_prompts=True", "data.truncation='error'", "data.shuffle=False",
    "actor_rollout_ref.model.lora_rank=64", "actor_rollout_ref.model.lora_alpha=32",
    "actor_rollout_ref.actor.optim.lr=3e-6", "actor_rollout_ref.model.use_remove_padding=True",
    f"actor_rollout_ref.actor.ppo_mini_batch_size={MINI}",
    f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={MICRO}",
    "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.001",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl", "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={MICRO}",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6", f"actor_rollout_ref.rollout.n={N}",
    "actor_rollout_ref.rollout.load_format=safetensors",
    "actor_rollout_ref.rollout.layered_summon=True",
    f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={MICRO}",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True", "algorithm.use_kl_in_reward=False",
    "trainer.critic_warmup=0", "trainer.project_name='verl_grpo_example_gsm8k'",
    "trainer.experiment_name='qwen2.5_3b_grpo_lora'", "trainer.total_epochs=15"]

VERL_SEQ_BALANCE = [  # examples/ppo_trainer/run_qwen2-7b_seq_balance.sh
    "algorithm.adv_estimator=gae", "data.return_raw_chat=False", f"data.train_batch_size={B}",
    "data.filter_overlong_prompts=True", "data.truncation='error'",
    "actor_rollout_ref.actor.optim.lr=1e-6", "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    f"actor_rollout_ref.actor.ppo_mini_batch_size={MINI}",
    "actor_rollout_ref.actor.use_dynamic_bsz=True",
    f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={TOKENS}",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.actor.use_kl_loss=False", "actor_rollout_ref.rollout.mode=async",
    "actor_rollout_ref.rollout.multi_turn.format=hermes",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.5",
    f"actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu={TOKENS}",
    "critic.optim.lr=1e-5", "critic.model.use_remove_padding=True",
    "critic.model.enable_gradient_checkpointing=True",
    f"critic.ppo_max_token_len_per_gpu={TOKENS * 4}",
    "critic.model.fsdp_config.param_offload=False",
    "critic.model.fsdp_config.optimizer_offload=False", "algorithm.use_kl_in_reward=False",
    "trainer.critic_warmup=0", "trainer.project_name='verl_example_gsm8k'",
    "trainer.total_epochs=15"]

_VERL_OUTCOME = [  # the lines the RLOO, REINFORCE++ and GPG scripts share
    f"data.train_batch_size={B}", "data.filter_overlong_prompts=True",
    "data.truncation='error'", "actor_rollout_ref.model.use_remove_padding=True",
    f"actor_rollout_ref.actor.ppo_mini_batch_size={MINI}",
    f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={MICRO}",
    "actor_rollout_ref.actor.use_kl_loss=False",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={MICRO}",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6", f"actor_rollout_ref.rollout.n={N}",
    f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={MICRO}",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True", "trainer.critic_warmup=0",
    "trainer.total_epochs=15"]

VERL_RLOO = [*_VERL_OUTCOME,  # examples/rloo_trainer/run_qwen2-7b.sh
             "algorithm.adv_estimator=rloo", "actor_rollout_ref.actor.optim.lr=1e-6",
             "algorithm.use_kl_in_reward=True", "algorithm.kl_penalty=kl",
             "algorithm.kl_ctrl.kl_coef=0.001", "trainer.project_name='verl_rloo_example_gsm8k'"]

VERL_REINFORCE_PP = [*_VERL_OUTCOME,  # examples/reinforce_plus_plus_trainer/run_qwen2-7b_math_rf.sh
                     "algorithm.adv_estimator=reinforce_plus_plus",
                     "actor_rollout_ref.actor.optim.lr=3e-6",
                     "actor_rollout_ref.actor.kl_loss_coef=0.001",
                     "actor_rollout_ref.actor.kl_loss_type=mse",
                     "actor_rollout_ref.actor.entropy_coeff=0",
                     "algorithm.use_kl_in_reward=True"]

VERL_GPG = [*_VERL_OUTCOME,  # examples/gpg_trainer/run_qwen2-7b_math.sh
            "algorithm.adv_estimator=gpg", "actor_rollout_ref.actor.optim.lr=1e-6",
            "actor_rollout_ref.actor.policy_loss.loss_mode=gpg",
            "actor_rollout_ref.actor.kl_loss_coef=0.001",
            "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
            "actor_rollout_ref.actor.entropy_coeff=0", "algorithm.use_kl_in_reward=False"]

VERL_REMAX = [  # examples/remax_trainer/run_qwen2.5-3b_seq_balance.sh
    "algorithm.adv_estimator=remax", f"data.train_batch_size={B}",
    "data.filter_overlong_prompts=True", "data.truncation='error'",
    "actor_rollout_ref.actor.optim.lr=1e-6", "actor_rollout_ref.model.use_remove_padding=True",
    f"actor_rollout_ref.actor.ppo_mini_batch_size={MINI}",
    "actor_rollout_ref.actor.use_dynamic_bsz=True",
    f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={TOKENS}",
    "actor_rollout_ref.actor.use_kl_loss=False",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.8", f"actor_rollout_ref.rollout.n={N}",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True", "algorithm.use_kl_in_reward=True",
    "algorithm.kl_penalty=kl", "algorithm.kl_ctrl.kl_coef=0.001", "trainer.critic_warmup=0",
    "trainer.project_name='verl_remax_example_gsm8k'", "trainer.total_epochs=5"]

VERL_ULYSSES = [  # examples/ppo_trainer/run_deepseek7b_llm_sp2.sh (2 workers)
    "algorithm.adv_estimator=gae", f"data.train_batch_size={B}",
    "data.filter_overlong_prompts=True", "data.truncation='error'",
    "actor_rollout_ref.actor.optim.lr=1e-6", "actor_rollout_ref.model.use_remove_padding=True",
    f"actor_rollout_ref.actor.ppo_mini_batch_size={MINI}",
    f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={MICRO}",
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.actor.use_kl_loss=False",
    f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={MICRO}",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6", "critic.optim.lr=1e-5",
    "critic.ulysses_sequence_parallel_size=2", "critic.model.use_remove_padding=True",
    "critic.model.enable_gradient_checkpointing=True",
    f"critic.ppo_micro_batch_size_per_gpu={MICRO}", "critic.model.fsdp_config.param_offload=False",
    "critic.model.fsdp_config.optimizer_offload=False", "algorithm.use_kl_in_reward=False",
    "trainer.critic_warmup=0", "trainer.total_epochs=15"]

SIIRL_CPGD = [  # examples/cpgd_trainer/run_qwen2_5-7b.sh
    "algorithm.adv_estimator=cpgd", f"data.train_batch_size={B}",
    "data.filter_overlong_prompts=True", "data.truncation='error'", "data.shuffle=False",
    "actor_rollout_ref.actor.optim.lr=1e-6", "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.model.use_fused_kernels=False",
    "actor_rollout_ref.actor.policy_drift_coeff=0.001",
    "actor_rollout_ref.actor.policy_loss.loss_mode=cpgd",
    f"actor_rollout_ref.actor.ppo_mini_batch_size={MINI}",
    f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={MICRO}",
    "actor_rollout_ref.actor.use_kl_loss=False", "actor_rollout_ref.actor.grad_clip=0.5",
    "actor_rollout_ref.actor.clip_ratio=0.2", "actor_rollout_ref.actor.kl_loss_coef=0.01",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={MICRO}",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
    f"actor_rollout_ref.rollout.max_model_len={P + R}",
    "actor_rollout_ref.rollout.enable_chunked_prefill=False",
    "actor_rollout_ref.rollout.enforce_eager=False",
    "actor_rollout_ref.rollout.free_cache_engine=False", f"actor_rollout_ref.rollout.n={N}",
    f"actor_rollout_ref.rollout.prompt_length={P}",
    f"actor_rollout_ref.rollout.response_length={R}",
    f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={MICRO}",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "algorithm.weight_factor_in_cpgd='STD_weight'", "algorithm.kl_ctrl.kl_coef=0.001",
    "trainer.critic_warmup=0", "trainer.project_name=siirl_example", "trainer.total_epochs=30",
    "trainer.resume_mode=auto", "trainer.max_actor_ckpt_to_keep=5",
    "trainer.val_before_train=True"]

# the default run (a few seconds each); SIIRL_LAUNCH_SCRIPTS=all (nox -s launch_scripts)
# runs every one
FAST = {"verl_rm": VERL_RM, "verl_remax": VERL_REMAX, "verl_gpg": VERL_GPG,
        "siirl_cpgd": SIIRL_CPGD}
MORE = {"verl_lora": VERL_LORA, "verl_seq_balance": VERL_SEQ_BALANCE, "verl_rloo": VERL_RLOO,
        "verl_reinforce_pp": VERL_REINFORCE_PP}
# with 2 workers (Ulysses groups of 2): all only
TWO_WORKERS = {"verl_ulysses": VERL_ULYSSES}
