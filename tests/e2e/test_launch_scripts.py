"""Real launch scripts' override lists run here for 2 steps and mean what they mean in their
own framework: verl's GRPO, PPO and GSPO examples and DAPO recipe, siiRL's GRPO, PPO and DAPO
examples, and (``launch_script_lists``) verl's reward-model and ReMax and GPG scripts and
siiRL's CPGD example; with ``SIIRL_LAUNCH_SCRIPTS=all`` (``nox -s launch_scripts``) also
verl's LoRA, sequence-balance, RLOO, REINFORCE++ and Ulysses (2 workers) scripts.

Each list is the script's ``key=value`` lines (verl: examples/grpo_trainer/run_qwen2-7b.sh,
examples/ppo_trainer/run_gemma.sh, examples/gspo_trainer/test_gspo_3b_math.sh, the DAPO
recipe as tests/special_e2e/run_dapo.sh runs it with the recipe's own
``+reward_model.reward_kwargs.overlong_buffer_cfg`` spelling; siiRL:
examples/{grpo,ppo,dapo}_trainer/run_qwen*.sh), with its shell variables filled in, then
shrunk: sizes small, data and model paths removed (the built-in task and model), one CPU
worker, the ``hf`` rollout, 2 steps. What each script asks for must then show in the run:
DAPO's dynamic sampling, PPO's critic. ``use_remove_padding=True`` (in six of the scripts)
stays in: those runs pack their rows.

Left out: settings these CPU runs refuse, each tested below to stop a CPU run naming the
key: the reference's parameter offload (in four of the scripts) and, from the GSPO script,
parameter/optimizer offload (CPU offload needs a GPU to offload from).
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import launch_script_lists
import pytest

B, MINI, MICRO, N, P, R = 8, 8, 4, 4, 256, 8  # the shrunk sizes

SHRINK = [f"data.max_prompt_length={P}", f"data.max_response_length={R}",
          "actor_rollout_ref.rollout.name=hf",
          "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
          "trainer.n_gpus_per_node=1", "trainer.nnodes=1", "trainer.total_training_steps=2",
          "trainer.save_freq=-1", "trainer.test_freq=-1", "trainer.val_before_train=false",
          "trainer.logger=[console]", "trainer.device=cpu"]

VERL_GRPO = [  # examples/grpo_trainer/run_qwen2-7b.sh
    "algorithm.adv_estimator=grpo", f"data.train_batch_size={B}",
    "data.filter_overlong_prompts=True", "data.truncation='error'",
    "actor_rollout_ref.actor.optim.lr=1e-6", "actor_rollout_ref.model.use_remove_padding=True",
    f"actor_rollout_ref.actor.ppo_mini_batch_size={MINI}",
    f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={MICRO}",
    "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.001",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl", "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={MICRO}",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6", f"actor_rollout_ref.rollout.n={N}",
    f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={MICRO}",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "algorithm.use_kl_in_reward=False", "trainer.critic_warmup=0",
    "trainer.project_name='verl_grpo_example_gsm8k'",
    "trainer.experiment_name='qwen2_7b_function_rm'", "trainer.total_epochs=15"]

VERL_PPO = [  # examples/ppo_trainer/run_gemma.sh
    "algorithm.adv_estimator=gae", f"data.train_batch_size={B}",
    "data.filter_overlong_prompts=True", "data.truncation='error'",
    "actor_rollout_ref.actor.optim.lr=1e-6", "actor_rollout_ref.model.use_remove_padding=False",
    f"actor_rollout_ref.actor.ppo_mini_batch_size={MINI}",
    f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={MICRO}",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.actor.use_kl_loss=False",
    f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={MICRO}",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.4", "critic.optim.lr=1e-5",
    "critic.model.use_remove_padding=False", "critic.model.enable_gradient_checkpointing=False",
    f"critic.ppo_micro_batch_size_per_gpu={MICRO}", "critic.model.fsdp_config.param_offload=False",
    "critic.model.fsdp_config.optimizer_offload=False", "algorithm.use_kl_in_reward=False",
    "trainer.critic_warmup=0", "trainer.project_name='verl_example'",
    "trainer.experiment_name='gemma2b_function_rm'", "trainer.total_epochs=15"]

VERL_GSPO = [  # examples/gspo_trainer/test_gspo_3b_math.sh
    "algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
    "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
    f"data.train_batch_size={B}", "data.filter_overlong_prompts=True", "data.truncation='error'",
    "data.return_raw_chat=True", "algorithm.use_kl_in_reward=False",
    "algorithm.kl_ctrl.kl_coef=0.0", "actor_rollout_ref.actor.use_kl_loss=False",
    "actor_rollout_ref.actor.kl_loss_coef=0.0", "actor_rollout_ref.actor.clip_ratio_low=0.0003",
    "actor_rollout_ref.actor.clip_ratio_high=0.0004", "actor_rollout_ref.actor.clip_ratio_c=10.0",
    "actor_rollout_ref.model.use_remove_padding=True", f"actor_rollout_ref.rollout.n={N}",
    "actor_rollout_ref.actor.optim.lr=1e-6", "actor_rollout_ref.actor.optim.weight_decay=0.1",
    f"actor_rollout_ref.actor.ppo_mini_batch_size={MINI}",
    f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={MICRO}",
    "actor_rollout_ref.actor.entropy_coeff=0", "actor_rollout_ref.actor.grad_clip=1.0",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.8",
    "actor_rollout_ref.rollout.temperature=1.0", "actor_rollout_ref.rollout.top_p=1.0",
    "actor_rollout_ref.rollout.top_k=-1", "actor_rollout_ref.rollout.val_kwargs.top_p=0.7",
    "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
    "actor_rollout_ref.rollout.val_kwargs.do_sample=True",
    "actor_rollout_ref.rollout.val_kwargs.n=1",
    "actor_rollout_ref.actor.use_dynamic_bsz=true",
    f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={(P + R) * 2}",
    f"actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu={(P + R) * 3}",
    f"actor_rollout_ref.ref.log_prob_max_token_len_per_gpu={(P + R) * 3}",
    "actor_rollout_ref.actor.entropy_checkpointing=true",
    "reward_model.reward_manager=dapo", "trainer.project_name='RL-GSPO'",
    "trainer.total_epochs=10"]

VERL_DAPO = [  # the DAPO recipe (tests/special_e2e/run_dapo.sh), its reward_kwargs spelling
    "reward_model.reward_manager=dapo", "algorithm.adv_estimator=grpo",
    "algorithm.use_kl_in_reward=False", "algorithm.kl_ctrl.kl_coef=0.0",
    "actor_rollout_ref.actor.use_kl_loss=False", "actor_rollout_ref.actor.kl_loss_coef=0.0",
    "actor_rollout_ref.actor.clip_ratio_low=0.2", "actor_rollout_ref.actor.clip_ratio_high=0.28",
    "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
    "+reward_model.reward_kwargs.overlong_buffer_cfg.len=4",
    "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0",
    "+reward_model.reward_kwargs.overlong_buffer_cfg.log=False",
    f"+reward_model.reward_kwargs.max_resp_len={R}",
    "actor_rollout_ref.actor.loss_agg_mode=token-mean", f"data.train_batch_size={B}",
    f"data.gen_batch_size={2 * B}", "algorithm.filter_groups.enable=True",
    "algorithm.filter_groups.metric=seq_reward", "algorithm.filter_groups.max_num_gen_batches=10",
    "actor_rollout_ref.actor.optim.lr=1e-6", "actor_rollout_ref.model.use_remove_padding=True",
    f"actor_rollout_ref.rollout.n={N}", f"actor_rollout_ref.actor.ppo_mini_batch_size={MINI}",
    f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={MICRO}",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={MICRO}",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.8",
    f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={MICRO}",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "actor_rollout_ref.model.use_fused_kernels=True",
    "trainer.project_name='verl-test'", "trainer.total_epochs=2", "trainer.resume_mode=disable"]

_SIIRL_COMMON = [
    f"data.train_batch_size={B}", "data.filter_overlong_prompts=True", "data.shuffle=False",
    "actor_rollout_ref.actor.optim.lr=1e-6", "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.model.use_fused_kernels=False",
    f"actor_rollout_ref.actor.ppo_mini_batch_size={MINI}",
    f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={MICRO}",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={MICRO}",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
    "actor_rollout_ref.rollout.enforce_eager=False",
    "actor_rollout_ref.rollout.free_cache_engine=False",
    f"actor_rollout_ref.rollout.n={N}", f"actor_rollout_ref.rollout.prompt_length={P}",
    f"actor_rollout_ref.rollout.response_length={R}",
    f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={MICRO}",
    "trainer.critic_warmup=0", "trainer.project_name=siirl_example",
    "trainer.total_epochs=30", "trainer.resume_mode=auto", "trainer.max_actor_ckpt_to_keep=1"]

SIIRL_GRPO = [*_SIIRL_COMMON,  # examples/grpo_trainer/run_qwen2_5-7b.sh
              "actor_rollout_ref.ref.fsdp_config.param_offload=True",
              "algorithm.adv_estimator=grpo", "data.truncation='error'",
              "actor_rollout_ref.actor.policy_drift_coeff=0.001",
              "actor_rollout_ref.actor.use_kl_loss=False", "actor_rollout_ref.actor.grad_clip=0.5",
              "actor_rollout_ref.actor.clip_ratio=0.2", "actor_rollout_ref.actor.kl_loss_coef=0.01",
              "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
              "actor_rollout_ref.rollout.enable_chunked_prefill=False",
              "algorithm.weight_factor_in_cpgd='STD_weight'", "algorithm.kl_ctrl.kl_coef=0.001"]

SIIRL_PPO = [*_SIIRL_COMMON,  # examples/ppo_trainer/run_qwen3-8b.sh
             "actor_rollout_ref.ref.fsdp_config.param_offload=True",
             "algorithm.adv_estimator=gae", "data.truncation='error'",
             "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.grad_clip=0.5",
             "actor_rollout_ref.actor.clip_ratio=0.2", "actor_rollout_ref.actor.kl_loss_coef=0.01",
             "actor_rollout_ref.actor.kl_loss_type=low_var_kl", "critic.optim.lr=1e-5",
             "critic.model.use_remove_padding=True",
             f"critic.ppo_micro_batch_size_per_gpu={MICRO}", "algorithm.kl_ctrl.kl_coef=0.001"]

SIIRL_DAPO = [*_SIIRL_COMMON,  # examples/dapo_trainer/run_qwen2_5-7b.sh
              "algorithm.adv_estimator=grpo", f"data.gen_batch_size={2 * B}",
              "data.truncation='left'", "data.prompt_key=prompt",
              "actor_rollout_ref.actor.optim.lr_warmup_steps=10",
              "actor_rollout_ref.actor.optim.weight_decay=0.1",
              "actor_rollout_ref.actor.use_kl_loss=False",
              "actor_rollout_ref.actor.kl_loss_coef=0.0",
              "actor_rollout_ref.actor.grad_clip=1.0", "actor_rollout_ref.actor.clip_ratio_low=0.2",
              "actor_rollout_ref.actor.clip_ratio_high=0.28",
              "actor_rollout_ref.actor.clip_ratio_c=10.0",
              "actor_rollout_ref.actor.entropy_coeff=0",
              "actor_rollout_ref.actor.loss_agg_mode=token-mean",
              "actor_rollout_ref.actor.fsdp_config.fsdp_size=-1",
              "actor_rollout_ref.actor.ulysses_sequence_parallel_size=1",
              "actor_rollout_ref.rollout.enable_chunked_prefill=True",
              f"actor_rollout_ref.rollout.max_num_batched_tokens={P + R}",
              f"actor_rollout_ref.rollout.max_model_len={P + R}",
              "actor_rollout_ref.rollout.temperature=1.0", "actor_rollout_ref.rollout.top_p=1.0",
              "actor_rollout_ref.rollout.top_k=-1",
              "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
              "actor_rollout_ref.rollout.val_kwargs.top_p=1.0",
              "actor_rollout_ref.rollout.val_kwargs.top_k=-1",
              "actor_rollout_ref.rollout.val_kwargs.do_sample=True",
              "actor_rollout_ref.rollout.val_kwargs.n=1", "algorithm.workflow_type=dapo",
              "algorithm.use_kl_in_reward=False", "algorithm.kl_ctrl.kl_coef=0.0",
              "algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=acc",
              "algorithm.filter_groups.max_num_gen_batches=10", "reward_model.reward_manager=dapo",
              "reward_model.overlong_buffer.enable=True", "reward_model.overlong_buffer.len=4",
              "reward_model.overlong_buffer.penalty_factor=1.0"]

UNBUILT = ("actor_rollout_ref.actor.fsdp_config.param_offload=True",
           "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True",
           "actor_rollout_ref.ref.fsdp_config.param_offload=True")

SCRIPTS = {"verl_grpo": VERL_GRPO, "verl_ppo": VERL_PPO, "verl_gspo": VERL_GSPO,
           "verl_dapo_recipe": VERL_DAPO, "siirl_grpo": SIIRL_GRPO, "siirl_ppo": SIIRL_PPO,
           "siirl_dapo": SIIRL_DAPO, **launch_script_lists.FAST}
# more scripts (launch_script_lists): SIIRL_LAUNCH_SCRIPTS=all, as nox -s launch_scripts runs
ALL = os.environ.get("SIIRL_LAUNCH_SCRIPTS") == "all"
if ALL:
    SCRIPTS.update(launch_script_lists.MORE)
    SCRIPTS.update(launch_script_lists.TWO_WORKERS)
# the workers a script's settings need (Ulysses groups of 2), started in a local Ray cluster
WORKERS = {name: ["trainer.n_gpus_per_node=2", "trainer.ray_address=local",
                  f"trainer.ray_temp_dir={tempfile.mkdtemp(prefix='ray', dir='/tmp')}"]
           for name in launch_script_lists.TWO_WORKERS}


def run(run_dir: Path, overrides: list, workers: tuple = ()) -> list:
    built = [o for o in overrides if o not in UNBUILT]
    env = dict(os.environ, RAY_ADDRESS="") if workers else None
    proc = subprocess.run([sys.executable, "-m", "siirl.main_dag", *built, *SHRINK, *workers,
                           f"trainer.default_local_dir={run_dir}"],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_a_launch_script_runs_and_means_what_it_says(name, tmp_path):
    steps = run(tmp_path, SCRIPTS[name], tuple(WORKERS.get(name, ())))
    assert [r["step"] for r in steps] == [1, 2]
    first = steps[0]
    if "dapo" in name:  # dynamic sampling on, in rounds of data.gen_batch_size prompts
        assert "dynamic_sampling/num_gen_batches" in first
        assert first["dynamic_sampling/step_groups/total"] >= 2 * B
    else:
        assert "dynamic_sampling/num_gen_batches" not in first
    if "algorithm.adv_estimator=gae" in SCRIPTS[name]:  # a critic trains
        assert "critic/vf_loss" in first
    else:
        assert "critic/vf_loss" not in first
    if "reward_model.enable=True" in SCRIPTS[name]:  # the reward model scores too
        assert "reward/rm/mean" in first
    if "remax" in name:  # the greedy baseline was played and scored
        assert "remax/baseline_score/mean" in first and "timing_s/rollout_greedy_baseline" in first


@pytest.mark.parametrize("override", UNBUILT)
def test_a_setting_not_built_yet_stops_the_run_naming_it(override):
    from siirl.errors import ConfigError
    from siirl.params.parser import parse_config

    with pytest.raises(ConfigError, match=override.split("=")[0].replace(".", r"\.")):
        parse_config([override, "trainer.device=cpu"])


EXAMPLES = Path(__file__).resolve().parent / "data/siirl_examples/examples"
SIIRL_MULTI_TURN = [  # examples/multi_turn/gsm8k/run_qwen2_5-3b_grpo_multiturn_sglang.sh
    "algorithm.adv_estimator=grpo", f"data.train_batch_size={B}",
    "data.filter_overlong_prompts=True", "data.return_raw_chat=True", "data.truncation='error'",
    "data.shuffle=False", "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.model.use_fused_kernels=False",
    f"actor_rollout_ref.actor.ppo_mini_batch_size={MINI}",
    f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={MICRO}",
    "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.grad_clip=0.5",
    "actor_rollout_ref.actor.clip_ratio=0.2", "actor_rollout_ref.actor.kl_loss_coef=0.01",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={MICRO}",
    "actor_rollout_ref.rollout.mode=sync", "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
    f"actor_rollout_ref.rollout.max_model_len={P + R}",
    "actor_rollout_ref.rollout.enable_chunked_prefill=False",
    "actor_rollout_ref.rollout.enforce_eager=False",
    "actor_rollout_ref.rollout.free_cache_engine=False", f"actor_rollout_ref.rollout.n={N}",
    f"actor_rollout_ref.rollout.prompt_length={P}",
    f"actor_rollout_ref.rollout.response_length={R}",
    f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={MICRO}",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True", "algorithm.kl_ctrl.kl_coef=0.001",
    "trainer.critic_warmup=0", "trainer.resume_mode=auto", "trainer.max_actor_ckpt_to_keep=5",
    "actor_rollout_ref.rollout.multi_turn.enable=True",
    "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=5",
    "actor_rollout_ref.rollout.multi_turn.tool_config_path="
    f"{EXAMPLES}/multi_turn/config/tool_config/gsm8k_tool_config.yaml",
    "actor_rollout_ref.rollout.multi_turn.interaction_config_path="
    f"{EXAMPLES}/multi_turn/config/interaction_config/gsm8k_interaction_config.yaml"]


def _gsm8k_rows(path: Path) -> Path:
    """GSM8K-style rows as siiRL's multi-turn preprocessing writes them (the tool's and the
    interaction's kwargs in extra_info), with the built-in task's problems."""
    rows = []
    for i in range(2 * B):
        truth = str(i + 3)
        rows.append({"data_source": "openai/gsm8k", "ability": "math",
                     "prompt": [{"role": "user", "content": f"{i}+3="}],
                     "reward_model": {"style": "rule", "ground_truth": truth},
                     "extra_info": {"index": i, "interaction_kwargs": {
                         "name": "gsm8k", "query": f"{i}+3=", "ground_truth": truth},
                         "tools_kwargs": {"calc_gsm8k_reward": {
                             "create_kwargs": {"ground_truth": truth}}}}})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_siirls_multi_turn_example_runs_with_its_tool_and_interaction(tmp_path):
    data = _gsm8k_rows(tmp_path / "gsm8k.jsonl")
    steps = run(tmp_path / "run", [*SIIRL_MULTI_TURN, f"data.train_files={data}"])
    assert [r["step"] for r in steps] == [1, 2]
    # every reply without a tool call went to siiRL's GSM8K interaction, which answered
    assert steps[0]["multi_turn/user_turns/mean"] > 0


def _tiny_with_chat_template(folder: Path) -> Path:
    """The built-in tiny model with a plain chat template: siiRL's MARFT process file renders
    every prompt with one (as the Qwen models its example names have)."""
    import shutil

    from siirl.engine.models.loader import tiny_arith_dir

    shutil.copytree(tiny_arith_dir(), folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.skipif(not ALL, reason="4 workers: SIIRL_LAUNCH_SCRIPTS=all (nox -s launch_scripts)")
def test_siirls_marft_example_files_run_unchanged(tmp_path):
    """siiRL's MARFT workflow, process and math-environment files as siiRL ships them (its
    run script's settings, shrunk); the workflow asks for rollout tensor parallel size 4."""
    model = _tiny_with_chat_template(tmp_path / "model")
    overrides = ["algorithm.adv_estimator=gae_marft", f"data.train_batch_size={B}",
                 "data.return_raw_chat=True", f"actor_rollout_ref.model.path={model}",
                 f"critic.model.path={model}", f"actor_rollout_ref.actor.ppo_mini_batch_size={B}",
                 f"critic.ppo_mini_batch_size={B}", "actor_rollout_ref.actor.use_kl_loss=True",
                 "actor_rollout_ref.rollout.agent.rewards_with_env=True",
                 "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
                 "actor_rollout_ref.rollout.multi_turn.use_all_traj=False",
                 "algorithm.use_kl_in_reward=False",
                 "dag.workflow_path=examples/experimental/marft/config/workflow_marft.yaml",
                 "trainer.n_gpus_per_node=4", "trainer.ray_address=local", "trainer.device=cpu",
                 f"trainer.ray_temp_dir={tempfile.mkdtemp(prefix='ray', dir='/tmp')}",
                 "trainer.total_training_steps=2", "trainer.save_freq=-1",
                 "trainer.test_freq=-1", "trainer.val_before_train=false", "trainer.logger=[]",
                 f"data.max_prompt_length={P}", f"data.max_response_length={R}",
                 f"trainer.default_local_dir={tmp_path / 'run'}"]
    proc = subprocess.run([sys.executable, "-m", "siirl.main_dag", *overrides],
                          capture_output=True, text=True, timeout=600,
                          cwd=EXAMPLES.parent,  # the workflow names its files from there
                          env=dict(os.environ, RAY_ADDRESS="", RAY_AUTH_MODE="disabled"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    steps = [json.loads(line) for line in
             (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps] == [1, 2]
    for group in (0, 1):
        assert f"agent_group_{group}/critic/vf_loss" in steps[0]
