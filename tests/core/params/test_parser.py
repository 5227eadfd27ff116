"""parse_config: schema <- preset YAML <- key=value overrides, with errors that name the key."""

import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from siirl.errors import ConfigError
from siirl.params.parser import parse_config, register_with_hydra, schema_paths, suggest


def test_defaults_resolve_interpolations():
    cfg = parse_config([])
    assert cfg.algorithm.adv_estimator == "grpo"
    assert cfg.actor_rollout_ref.rollout.name == "hf"
    assert cfg.trainer.project_name in cfg.trainer.default_local_dir
    assert "${" not in OmegaConf.to_yaml(cfg)


def test_overrides_use_hydra_grammar():
    cfg = parse_config(["actor_rollout_ref.rollout.n=8", "data.train_files=[a.parquet,b.parquet]",
                        "actor_rollout_ref.actor.optim.lr=1e-6", "trainer.logger=[console]",
                        "critic.enable=true", "algorithm.adv_estimator=gae",
                        "trainer.total_training_steps=null"])
    assert cfg.actor_rollout_ref.rollout.n == 8
    assert list(cfg.data.train_files) == ["a.parquet", "b.parquet"]
    assert cfg.actor_rollout_ref.actor.optim.lr == pytest.approx(1e-6)
    assert cfg.critic.enable is True and cfg.trainer.total_training_steps is None


@pytest.mark.parametrize("override,suggestion", [
    ("actor_rollout_ref.rollout.nn=3", "actor_rollout_ref.rollout.n"),
    ("rollout.n=3", "actor_rollout_ref.rollout.n"),
    ("trainer.total_epoch=3", "trainer.total_epochs"),
    ("data.max_prompt_len=3", "data.max_prompt_length"),
])
def test_unknown_key_names_path_and_suggests(override, suggestion):
    with pytest.raises(ConfigError) as info:
        parse_config([override])
    message = str(info.value)
    assert override.split("=")[0] in message and f"did you mean {suggestion}?" in message


def test_suggestion_is_never_the_enclosing_group():
    assert "did you mean trainer?" not in suggest("trainer.zzzz_unrelated")


def test_wrong_type_names_key():
    with pytest.raises(ConfigError, match="trainer.total_epochs"):
        parse_config(["trainer.total_epochs=abc"])
    with pytest.raises(ConfigError, match="actor_rollout_ref.actor.use_kl_loss"):
        parse_config(["actor_rollout_ref.actor.use_kl_loss=maybe"])


def test_plus_adds_only_to_free_form_dicts():
    cfg = parse_config(["+actor_rollout_ref.model.override_config.attention_dropout=0.1"])
    assert cfg.actor_rollout_ref.model.override_config.attention_dropout == 0.1
    with pytest.raises(ConfigError, match="fixed set of keys"):
        parse_config(["+trainer.brand_new=1"])


def test_delete_only_free_form_entries():
    cfg = parse_config(["+custom_reward_function.reward_kwargs.scale=2",
                        "~custom_reward_function.reward_kwargs.scale"])
    assert "scale" not in cfg.custom_reward_function.reward_kwargs
    with pytest.raises(ConfigError, match="part of the schema"):
        parse_config(["~trainer.total_epochs"])


def test_not_key_value_argument():
    with pytest.raises(ConfigError, match="not key=value"):
        parse_config(["trainer.total_epochs"])


def test_comma_value_is_refused_as_a_sweep_and_quoting_passes_it():
    with pytest.raises(ConfigError, match="sweep.*quote the value"):
        parse_config(["actor_rollout_ref.embodied.env.env_name=reach_red,reach_blue"])
    cfg = parse_config(['actor_rollout_ref.embodied.env.env_name="reach_red,reach_blue"'])
    assert cfg.actor_rollout_ref.embodied.env.env_name == "reach_red,reach_blue"


def test_preset_merge_and_errors(tmp_path):
    preset = tmp_path / "p.yaml"
    preset.write_text("actor_rollout_ref:\n  rollout:\n    n: 4\n  model:\n"
                      "    override_config: {hidden_dropout: 0.0}\n")
    cfg = parse_config(["actor_rollout_ref.rollout.n=6"], str(preset))
    assert cfg.actor_rollout_ref.rollout.n == 6  # command line wins over the preset
    assert cfg.actor_rollout_ref.model.override_config.hidden_dropout == 0.0
    preset.write_text("data:\n  train_batch_sizes: 4\n")
    with pytest.raises(ConfigError) as info:
        parse_config([], str(preset))
    assert "data.train_batch_sizes" in str(info.value) and str(preset) in str(info.value)
    preset.write_text("data: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        parse_config([], str(preset))
    with pytest.raises(ConfigError, match="does not exist"):
        parse_config([], str(tmp_path / "missing.yaml"))


def test_result_is_struct_mode():
    cfg = parse_config([])
    from omegaconf.errors import ConfigAttributeError

    with pytest.raises(ConfigAttributeError):
        cfg.trainer.not_a_key = 1


def test_schema_paths_cover_spec_keys():
    paths = set(schema_paths())
    for key in ("algorithm.adv_estimator", "algorithm.workflow_type", "data.train_files",
                "data.train_batch_size", "data.max_prompt_length", "data.max_response_length",
                "actor_rollout_ref.model.path", "actor_rollout_ref.actor.optim.lr",
                "actor_rollout_ref.actor.ppo_mini_batch_size", "actor_rollout_ref.rollout.name",
                "actor_rollout_ref.rollout.tensor_model_parallel_size",
                "actor_rollout_ref.rollout.n", "trainer.n_gpus_per_node", "trainer.nnodes",
                "trainer.total_epochs", "trainer.save_freq", "dag.custom_pipeline_fn",
                "critic.enable", "algorithm.filter_groups.enable", "reward_model",
                "custom_reward_function.path"):
        assert key in paths, key


def test_hydra_config_store_registration():
    from hydra.core.config_store import ConfigStore

    register_with_hydra()
    assert "siirl_config.yaml" in ConfigStore.instance().list("/")


def test_parsing_imports_nothing_heavy():
    # of the engine package only what loading the config sections it registers (siirl.config)
    # imports (their light modules: name tables, settings) is read, as tools/check_wheels.py
    # allows: no other engine module, and nothing heavy
    code = ("import sys\nimport importlib.metadata as md\n"
            "for ep in md.entry_points(group='siirl.config'):\n    ep.load()\n"
            "sections = set(sys.modules)\n"
            "from siirl.params.parser import parse_config\n"
            "parse_config(['trainer.total_epochs=3'])\n"
            "heavy = [m for m in ('torch', 'ray', 'transformers') if m in sys.modules]\n"
            "heavy += [m for m in sys.modules if m.startswith('siirl.engine.') and "
            "m not in sections]\n"
            "assert not heavy, heavy\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
