"""Console output: whole lines when not on a terminal, a bar on one, only the metrics that
are on (KL, critic, DAPO totals), library warnings to the run's warnings.log."""

import io
import warnings

from siirl.dag_worker.dagworker import DAGWorker
from siirl.dag_worker.data_structures import NodeOutput
from siirl.dag_worker.walk.console import ConsoleLogger, Progress, format_line, step_keys
from siirl.dag_worker.walk.trainer_loop import Trainer
from siirl.execution.dag.pipeline import Pipeline
from siirl.params.typed import to_typed

GRPO_STEP = {"critic/score/mean": 0.5, "actor/pg_loss": -0.01, "actor/kl_loss": 0.0,
             "actor/reward_kl_penalty": 0.0, "actor/entropy": 0.4, "actor/grad_norm": 2.0,
             "response_length/mean": 3.0, "perf/throughput": 5000.0, "timing_s/step": 0.3}
MEGATRON_FILE = "/venv/lib/python3.11/site-packages/megatron/core/models/backends.py"


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def _line(metrics, config=None, step=1):
    stream = io.StringIO()
    ConsoleLogger(config, stream=stream).log(step, metrics)
    text = stream.getvalue()
    assert text.count("\n") == 1 and "\r" not in text
    return text


def _kl_config(loss=False, reward=False):
    return to_typed({"actor_rollout_ref": {"actor": {"use_kl_loss": loss}},
                     "algorithm": {"use_kl_in_reward": reward}})


def test_one_whole_line_per_step_without_kl_when_kl_is_off():
    line = _line(GRPO_STEP, _kl_config())
    assert line.startswith("step 1: critic/score/mean=0.5  actor/pg_loss=-0.01")
    assert "kl" not in line and "timing_s/step=0.3" in line


def test_kl_shown_when_a_kl_term_is_configured():
    assert "actor/kl_loss=0" in _line(GRPO_STEP, _kl_config(loss=True))
    line = _line(GRPO_STEP, _kl_config(reward=True))
    assert "actor/reward_kl_penalty=0" in line and "actor/kl_loss" not in line
    assert "actor/kl_loss" in step_keys(_kl_config(loss=True))


def test_critic_metrics_shown_when_a_critic_ran():
    ppo = {**GRPO_STEP, "critic/vf_loss": 0.15, "critic/values/mean": -0.1}
    line = _line(ppo)
    assert "critic/vf_loss=0.15" in line and "critic/values/mean=-0.1" in line
    assert "critic/vf_loss" not in _line(GRPO_STEP)


def test_dapo_shows_the_step_totals_over_generation_batches():
    dapo = {**GRPO_STEP, "dynamic_sampling/total": 32.0, "dynamic_sampling/kept": 20.0,
            "dynamic_sampling/num_gen_batches": 3.0,
            "dynamic_sampling/step_groups/total": 96.0,
            "dynamic_sampling/step_groups/kept": 55.0}
    line = _line(dapo)
    assert "dynamic_sampling/num_gen_batches=3" in line
    assert "dynamic_sampling/step_groups/kept=55/96" in line
    assert "dynamic_sampling/kept=" not in line  # the last batch's count is not the step's


def test_validation_line_and_non_finite_values():
    assert _line({"val/score/mean": 0.75, "timing_s/validation": 0.1}, step=0) == \
        "step 0: val/score/mean=0.75  timing_s/validation=0.1\n"
    assert "throughput" not in _line({**GRPO_STEP, "perf/throughput": float("nan")})
    assert format_line(2, {"my/metric": 1.5}, step_keys(to_typed(None))) == "step 2: my/metric=1.5"


AGENTIC_STEP = {"env/success_rate": 0.25, "env/score/mean": 1.5, "env/Sok/success_rate": 0.25,
                "env/turns/mean": 4.0, "actor/pg_loss": -0.03, "actor/entropy": 0.35,
                "actor/grad_norm": 0.24, "timing_s/step": 4.3}
EMBODIED_STEP = {"env/success_rate": 0.5, "env/reward/mean": 0.5, "reward/score/mean": 0.5,
                 "embodied_sampling/kept": 4.0, "actor/pg_loss": 0.0, "timing_s/step": 1.3}


def test_each_workflow_leads_with_its_headline_metric():
    assert _line(GRPO_STEP).startswith("step 1: critic/score/mean=0.5  ")
    assert _line(AGENTIC_STEP).startswith(
        "step 1: env/success_rate=0.25  env/score/mean=1.5  actor/pg_loss=-0.03")
    assert _line(EMBODIED_STEP).startswith(
        "step 1: env/success_rate=0.5  env/reward/mean=0.5  actor/pg_loss=0")
    multi = {"multi_agent/success_rate": 0.75, "multi_agent/env_score/mean": 0.75}
    assert _line(multi) == \
        "step 1: multi_agent/success_rate=0.75  multi_agent/env_score/mean=0.75\n"


def test_validation_leads_with_the_success_rate_where_episodes_report_one():
    sokoban = {"val/score/mean": 2.232, "val/success_rate": 0.485,
               "val/SimpleSokoban/success_rate": 0.485, "val/response_length/mean": 27.9,
               "timing_s/validation": 10.1}
    assert _line(sokoban, step=20) == ("step 20: val/success_rate=0.485  val/score/mean=2.232"
                                       "  val/response_length/mean=27.9  "
                                       "timing_s/validation=10.1\n")
    # a validation record is recognised by its val/ keys, whichever it has
    assert _line({"val/success_rate": 0.5}, step=3) == "step 3: val/success_rate=0.5\n"


def test_the_user_nodes_metrics_follow_the_built_in_ones():
    custom = {"my_filter/kept", "critic/score/mean"}
    metrics = {**GRPO_STEP, "my_filter/kept": 0.75, "ref/skipped": 1.0}
    line = format_line(1, metrics, step_keys(to_typed(None)), custom)
    assert line.endswith("timing_s/step=0.3  my_filter/kept=0.75")
    assert line.count("critic/score/mean") == 1 and "ref/skipped" not in line
    many = {f"mine/m{i}": float(i) for i in range(12)}
    assert format_line(1, many, step_keys(to_typed(None)), set(many)).count("mine/") == 8


def _custom_filter(batch, config=None):
    return NodeOutput(batch=batch, metrics={"my_filter/kept": 0.75})


def test_a_custom_pipelines_node_metrics_reach_the_console(tmp_path, capsys):
    from omegaconf import OmegaConf

    from siirl.execution.dag.node import NodeRole, NodeType

    config = OmegaConf.create({"trainer": {
        "total_training_steps": 1, "default_local_dir": str(tmp_path), "logger": ["console"],
        "save_freq": -1, "test_freq": -1}})
    graph = (Pipeline("g")
             .add_node("step", func=_step)
             .add_node("my_filter", func=_custom_filter, deps=["step"],
                       node_type=NodeType.COMPUTE, node_role=NodeRole.DEFAULT)
             .build())
    worker = DAGWorker(graph, config)
    Trainer(worker).fit()
    out = capsys.readouterr().out
    assert out.startswith("step 1: critic/score/mean=0.5") and "my_filter/kept=0.75" in out
    rollout = graph.nodes["step"].__class__(
        node_id="rollout", node_type=NodeType.MODEL_INFERENCE, node_role=NodeRole.ROLLOUT,
        executable_ref="siirl.dag_worker.dagworker:DAGWorker.generate")
    assert not worker.executor.is_user_node(rollout)  # siiRL's own: headline keys only
    assert worker.executor.is_user_node(graph.nodes["my_filter"])


def test_progress_bar_only_on_a_terminal():
    piped = io.StringIO()
    progress = Progress(3, 0, stream=piped)
    progress.update()
    progress.close()
    assert progress.bar is None and piped.getvalue() == ""
    terminal = _Terminal()
    progress = Progress(3, 0, stream=terminal)
    assert progress.bar is not None
    lines = io.StringIO()
    ConsoleLogger(None, stream=lines).log(1, GRPO_STEP)  # written above the bar
    progress.update()
    progress.close()
    assert "training" in terminal.getvalue() and "\r" in terminal.getvalue()
    assert lines.getvalue().startswith("step 1: ") and "\r" not in lines.getvalue()
    assert Progress(3, 0, enabled=False, stream=_Terminal()).bar is None  # not rank 0


def _step(batch, config=None):
    warnings.warn_explicit("Apex is not installed. Falling back to Torch Norm", UserWarning,
                           MEGATRON_FILE, 21)
    return NodeOutput(batch=batch, metrics=dict(GRPO_STEP))


def test_trainer_redirected_output_is_whole_lines_and_warnings_go_to_the_log(tmp_path,
                                                                             capsys):
    config = {"trainer": {"total_training_steps": 3, "default_local_dir": str(tmp_path),
                          "logger": ["console"], "save_freq": -1, "test_freq": -1}}
    graph = Pipeline("g").add_node("step", func=_step).build()
    Trainer(DAGWorker(graph, config)).fit()
    captured = capsys.readouterr()  # capsys streams are not terminals
    assert "\r" not in captured.out + captured.err
    assert [line.split(":")[0] for line in captured.out.splitlines()] == \
        ["step 1", "step 2", "step 3"]
    assert "kl" not in captured.out
    assert "Apex" not in captured.err
    log = tmp_path / "warnings.log"
    # announced once, after the first step (start-up noise is in by then); later ones are
    # written to the file without another line
    assert captured.err.count("note:") == 1
    assert f"1 library warning(s) (megatron) that need no action are in {log}" in captured.err
    assert log.read_text().count("Apex is not installed") == 3
