"""The planner decides what of a workflow runs: left-out nodes with their reasons, the
log-prob nodes before the advantage with KL in the reward, and the weight-sync steps."""

import pytest

from siirl.execution.dag import builtin_pipelines as bp
from siirl.execution.dag.pipeline import Pipeline
from siirl.execution.dag.planner import plan_graph, reference_needed
from siirl.execution.scheduler.task_scheduler import TaskScheduler

ON_POLICY = {}  # the defaults: one epoch over one mini-batch, no shuffle
KL_LOSS = {"actor_rollout_ref": {"actor": {"use_kl_loss": True}}}
KL_REWARD = {"algorithm": {"use_kl_in_reward": True}}
TWO_EPOCHS = {"actor_rollout_ref": {"actor": {"ppo_epochs": 2}}}


def order(graph):
    return graph.get_execution_order()


def syncs(graph):
    return [(s.where, s.node_id) for s in graph.weight_syncs]


def test_grpo_on_policy_without_kl_leaves_both_log_prob_nodes_out():
    graph = plan_graph(bp.grpo_pipeline(), ON_POLICY)
    assert order(graph) == ["rollout_actor", "function_reward", "calculate_advantages",
                            "actor_train"]
    assert graph.nodes["actor_train"].dependencies == ["calculate_advantages"]
    assert set(graph.left_out) == {"actor_old_log_prob", "reference_log_prob"}
    assert "on-policy" in graph.left_out["actor_old_log_prob"].reason
    assert "no KL term" in graph.left_out["reference_log_prob"].reason
    text = graph.format()
    assert "left out: actor_old_log_prob: on-policy" in text
    assert "left out: reference_log_prob: no KL term" in text


def test_kl_loss_plans_the_reference_only():
    graph = plan_graph(bp.grpo_pipeline(), KL_LOSS)
    assert "reference_log_prob" in graph.nodes and "actor_old_log_prob" not in graph.nodes
    assert graph.nodes["actor_train"].dependencies == ["reference_log_prob"]
    assert reference_needed(KL_LOSS) and reference_needed(KL_REWARD)
    assert not reference_needed(ON_POLICY)


def test_an_update_that_is_not_on_policy_keeps_the_old_log_prob_node():
    graph = plan_graph(bp.grpo_pipeline(), TWO_EPOCHS)
    assert "actor_old_log_prob" in graph.nodes
    assert list(graph.left_out) == ["reference_log_prob"]


@pytest.mark.parametrize("factory,before", [
    (bp.grpo_pipeline, "function_reward"), (bp.ppo_pipeline, "critic_value"),
    (bp.dapo_pipeline, "dynamic_sampling")])
def test_kl_in_reward_orders_the_log_prob_nodes_before_the_advantage(factory, before):
    graph = plan_graph(factory(), KL_REWARD)
    steps = order(graph)
    at = steps.index("calculate_advantages")
    assert steps[at - 3:at + 2] == [before, "actor_old_log_prob", "reference_log_prob",
                                    "calculate_advantages", "actor_train"]
    assert graph.nodes["calculate_advantages"].dependencies == ["reference_log_prob"]
    assert graph.nodes["actor_train"].dependencies == ["calculate_advantages"]
    assert not graph.left_out


def test_critic_warmup_runs_the_old_log_prob_node_in_the_warmup_steps_only():
    graph = plan_graph(bp.ppo_pipeline(), {"trainer": {"critic_warmup": 2}})
    assert graph.nodes["actor_old_log_prob"].until_step == 2
    assert graph.left_out["actor_old_log_prob"].reason.startswith("from step 3")
    assert "actor_old_log_prob" in graph.format().split("left out")[0]
    assert "(steps 1-2 only)" in graph.format()


def test_weight_sync_steps_before_the_rollout_and_after_the_actor_update():
    graph = plan_graph(bp.ppo_pipeline(), ON_POLICY)
    assert syncs(graph) == [("before", "rollout_actor"), ("after", "actor_train")]
    lines = graph.format().splitlines()
    train = next(i for i, line in enumerate(lines) if line.strip().startswith("actor_train"))
    assert lines[train + 1].strip().startswith("weight_sync (actor -> rollout) after "
                                               "actor_train")
    remax = plan_graph(bp.remax_pipeline(), ON_POLICY)
    assert syncs(remax) == [("before", "rollout_greedy_baseline"), ("before", "rollout_actor"),
                            ("after", "actor_train")]


def test_planning_is_idempotent_and_copies():
    original = bp.grpo_pipeline()
    graph = plan_graph(original, ON_POLICY)
    assert plan_graph(graph, ON_POLICY) is graph
    assert "reference_log_prob" in original.nodes and not original.planned
    copied = graph.copy()
    assert copied.planned and copied.left_out == graph.left_out
    assert syncs(copied) == syncs(graph)


def user_ref(batch, config=None):
    raise AssertionError("not run here")


def test_custom_pipelines_are_planned_by_role_and_function():
    pipe = Pipeline("custom", "by role")
    pipe.add_node("gen", node_type="model_inference", node_role="rollout")
    pipe.add_node("score", deps=["gen"], node_type="compute", node_role="reward")
    pipe.add_node("adv", deps=["score"], node_type="compute", node_role="advantage")
    pipe.add_node("ref", deps=["adv"], node_type="model_train", node_role="reference",
                  only_forward_compute=True)
    pipe.add_node("mine", deps=["adv"], func=user_ref, node_type="model_inference",
                  node_role="reference")
    pipe.add_node("train", deps=["ref", "mine"], node_type="model_train", node_role="actor")
    graph = plan_graph(pipe.build(), ON_POLICY)
    assert list(graph.left_out) == ["ref"]  # the user's own reference function runs
    assert graph.nodes["train"].dependencies == ["adv", "mine"]


def test_kl_in_reward_reorders_a_custom_pipeline_by_role():
    pipe = Pipeline("custom", "kl in reward")
    pipe.add_node("gen", node_type="model_inference", node_role="rollout")
    pipe.add_node("adv", deps=["gen"], node_type="compute", node_role="advantage")
    pipe.add_node("old", deps=["adv"], node_type="model_inference", node_role="actor")
    pipe.add_node("ref", deps=["old"], node_type="model_inference", node_role="reference")
    pipe.add_node("train", deps=["ref"], node_type="model_train", node_role="actor")
    graph = plan_graph(pipe.build(), KL_REWARD)
    assert order(graph) == ["gen", "old", "ref", "adv", "train"]


def two_agents(settings=None, options=None, share=None):
    """Two agents, each: rollout, advantage, old log-probs, reference, update; ``settings``
    and ``options`` per group go on the group's nodes' ``config`` / its update's
    ``agent_options``; ``share`` on agent 1's update."""
    pipe = Pipeline("agents", "two agents")
    for group in (0, 1):
        config = (settings or {}).get(group, {})
        pipe.add_node(f"gen{group}", node_type="model_inference", node_role="rollout",
                      agent_group=group)
        pipe.add_node(f"adv{group}", deps=[f"gen{group}"], node_type="compute",
                      node_role="advantage", agent_group=group)
        pipe.add_node(f"old{group}", deps=[f"adv{group}"], node_type="model_inference",
                      node_role="actor", agent_group=group, config=config)
        pipe.add_node(f"ref{group}", deps=[f"old{group}"], node_type="model_inference",
                      node_role="reference", agent_group=group, config=config)
        agent_options = dict((options or {}).get(group, {}))
        if share is not None and group == 1:
            agent_options["share_instance"] = share
        pipe.add_node(f"train{group}", deps=[f"ref{group}"], node_type="model_train",
                      node_role="actor", agent_group=group, config=config,
                      agent_options=agent_options)
    return pipe.build()


def test_each_agent_is_asked_with_its_own_settings():
    graph = plan_graph(two_agents({1: {"actor.use_kl_loss": True}}), ON_POLICY)
    assert {"ref1"} <= set(graph.nodes) and not {"old0", "old1", "ref0"} & set(graph.nodes)
    assert list(graph.left_out) == ["ref0", "old0", "old1"]  # agent 1's KL loss is its own
    assert graph.nodes["train1"].dependencies == ["ref1"]
    assert graph.nodes["ref1"].dependencies == ["adv1"]
    assert "on-policy" in graph.left_out["old1"].reason
    plan = TaskScheduler(2).schedule(graph)
    assert [list(a.graph.left_out) for a in plan] == [["ref0", "old0"], ["old1"]]
    # agent 1 takes two epochs: only its own node runs
    graph = plan_graph(two_agents({1: {"actor.ppo_epochs": 2}}), ON_POLICY)
    assert "old1" in graph.nodes and "old0" not in graph.nodes


def test_an_agent_whose_actor_is_shared_keeps_its_old_log_prob_node():
    # agent 0's update would change the weights agent 1's first forward reads
    graph = plan_graph(two_agents(share=0), ON_POLICY)
    assert {"old0", "old1"} <= set(graph.nodes)
    assert sorted(graph.left_out) == ["ref0", "ref1"]


def test_an_agent_taking_train_cycle_turns_runs_its_node_while_it_waits():
    graph = plan_graph(two_agents(options={0: {"train_cycle": 2}}), ON_POLICY)
    assert graph.nodes["old0"].while_waiting == "train0" and "old1" not in graph.nodes
    assert graph.left_out["old0"].reason.startswith(
        "in the steps where train0 trains (agent_options.train_cycle=2): on-policy")
    assert "(steps where train0 waits for its train_cycle turn only)" in graph.format()
    graph = plan_graph(two_agents(options={0: {"train_cycle": 2}}),
                       {"trainer": {"critic_warmup": 1}})
    assert (graph.nodes["old0"].until_step, graph.nodes["old0"].while_waiting) == (1, "train0")
    assert graph.left_out["old0"].reason.startswith(
        "from step 2 (after trainer.critic_warmup=1), in the steps where train0 trains")
    assert "(steps 1-1 and steps where train0 waits for its train_cycle turn only)" in \
        graph.format()


def test_kl_in_reward_adds_the_log_prob_nodes_a_workflow_lacks():
    pipe = Pipeline("custom", "no log-prob nodes")
    pipe.add_node("gen", node_type="model_inference", node_role="rollout")
    pipe.add_node("adv", deps=["gen"], node_type="compute", node_role="advantage")
    pipe.add_node("train", deps=["adv"], node_type="model_train", node_role="actor")
    graph = plan_graph(pipe.build(), KL_REWARD)
    assert order(graph) == ["gen", "actor_old_log_prob", "reference_log_prob", "adv", "train"]
    assert graph.nodes["reference_log_prob"].executable_ref == \
        "siirl.dag_worker.dagworker:DAGWorker.compute_ref_log_prob"
