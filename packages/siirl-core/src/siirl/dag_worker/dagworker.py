"""DAGWorker: one per device; runs its TaskGraph over its own data, step after step.

This class only walks the graph. Calling a node is ``node_executor``; engines are owned by
``engines.WorkerEngines``; step metrics by ``metrics_collector``; advantage math lives in
``core_algos``. The built-in node functions below (``generate``, ``compute_reward``, ...) are
what ``"siirl.dag_worker.dagworker:DAGWorker.<method>"`` references run, bound to this worker.

Data along edges: an entry node receives the batch given to ``execute_task_graph``; a node
with one parent receives that parent's output batch; a node with several parents receives
their batches merged (``dag_utils.merge_parent_batches``: fields unioned, the parent listed
later in ``dependencies`` wins a shared field). A node returning ``batch=None`` passes its
input on unchanged. A node returning ``info={"regenerate": True}`` (DAPO's dynamic sampling
when it has too few prompt groups) restarts the graph on the next batch of the dataloader
within the same training step; ``step_state`` keeps what such a node gathered meanwhile.
When a parent's rows are laid out differently from what the node needs
(``layouts``: e.g. a tensor-parallel rollout feeding data-parallel training), the worker's
DataBuffer first moves them, worker to worker; with equal layouts nothing moves.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, Optional

from siirl.dag_worker.data_structures import NodeOutput, StepResult
from siirl.dag_worker.multi_agent.agent_groups import AgentGroups, sees_all_agents
from siirl.dag_worker.nodes import algorithm as algorithm_nodes
from siirl.dag_worker.nodes import remax_baseline
from siirl.dag_worker.walk.dag_utils import merge_parent_batches
from siirl.dag_worker.walk.metrics_collector import MetricsCollector
from siirl.dag_worker.walk.node_executor import NodeExecutor
from siirl.dag_worker.walk.weight_sync import (
    RolloutWeightSync,
    bucket_bytes_of,
    update_frequency_of,
)
from siirl.data_coordinator.fields import (
    ATTENTION_MASK,
    ENV_SCORES,
    INPUT_IDS,
    POSITION_IDS,
    PROMPTS,
    UID,
)
from siirl.errors import PipelineError
from siirl.execution.dag.planner import plan_graph
from siirl.execution.dag.task_graph import TaskGraph
from siirl.params.typed import to_typed


class DAGWorker:
    # Marks "module:DAGWorker.method" references as methods bound to the executing worker.
    __siirl_worker__ = True

    def __init__(self, taskgraph: TaskGraph, config: Any = None, rank: int = 0,
                 world_size: int = 1, *, comm: Any = None, process_groups: Any = None):
        """``rank``/``world_size``: this worker's data-parallel rank and size among the
        workers running the same graph; ``comm`` (a ``collective.WorkerComm``) spans every
        worker of the job; ``process_groups`` (a ``ProcessGroupManager``) gives each role
        its torch.distributed group. Both are None for a single worker. ``config``: the
        launcher's ``SiiRLArguments`` (a dict or DictConfig, e.g. a test's, is typed here)."""
        from siirl.dag_worker.walk.collective import WorkerComm

        taskgraph.validate_graph()
        config = to_typed(config)
        # it walks what the planner planned (a graph the launcher planned is kept)
        taskgraph = plan_graph(taskgraph, config, world_size)
        self.taskgraph = taskgraph
        self.config = config
        self.rank = rank
        self.world_size = world_size
        self.comm = comm if comm is not None else WorkerComm()
        self.process_groups = process_groups
        self._layouts: Dict[str, Any] = {}
        self._buffer = None
        self.step_state: Dict[str, Any] = {}  # node scratch space for one training step
        self.global_step = 0
        # per agent group (one for an ordinary graph): settings and engines
        self.agents = AgentGroups(taskgraph, config, worker=self)
        self.agent_group = self.agents.ids[0]  # whose engines ``engines`` gives now
        self._weight_syncs = {g: RolloutWeightSync(self.agents.engines[g],
                                                   bucket_bytes_of(self.agents.configs[g]),
                                                   update_frequency_of(self.agents.configs[g]))
                              for g in self.agents.ids}
        self.executor = NodeExecutor(self)
        self.metrics = MetricsCollector()
        self._order = taskgraph.get_execution_order()
        self._syncs = {(step.where, step.node_id) for step in taskgraph.weight_syncs}
        self.tokenizer = None
        self.is_data_source = True  # False on tensor-parallel peers holding copied rows
        self.train_loader = None
        self.val_loader = None
        # Named objects whose state must survive a resume (e.g. an adaptive KL controller):
        # each has state_dict()/load_state_dict().
        self.algorithm_objects: Dict[str, Any] = {}

    @property
    def engines(self) -> Any:
        """The engines of the agent group whose node runs now (the only group's, usually)."""
        return self.agents.engines[self.agent_group]

    @property
    def weight_sync(self) -> RolloutWeightSync:
        return self._weight_syncs[self.agent_group]

    def init_engines(self) -> None:
        """Import every engine plugin the graph needs, so a missing one fails up front."""
        self.agents.resolve()

    def setup(self) -> None:
        """Build this worker's engines (actor first: the others share its model and
        tokenizer) and, when one of them has a tokenizer, its dataloaders (so a pipeline
        whose rollout borrows the actor's model gets its prompts without an actor node)."""
        from siirl.dag_worker.walk.data_setup import build_dataloaders
        from siirl.dag_worker.walk.layouts import entry_layout, node_layouts

        if self.process_groups is not None:
            ranks, me = self.process_groups.ranks, self.comm.rank
        else:  # no process groups: this worker alone, or a hand-built rank for tests
            ranks, me = tuple(range(self.world_size)), self.rank
        self._layouts = node_layouts(self.taskgraph, self.config, ranks,
                                     lambda node: self.agents.configs[node.agent_group])
        data = entry_layout(self.taskgraph, self._layouts)
        self.agents.resolve()
        if "actor" in self.agents.all_roles():
            algorithm_nodes.check_algorithm_names(self.config)
        algorithm_nodes.setup_algorithm_objects(self, self.config)
        self.agents.build()
        self.tokenizer = self.engines.tokenizer()
        if self.tokenizer is not None:
            # rows by the entry node's data-parallel rank: tensor-parallel peers share them
            self.is_data_source = data.is_source(me)
            self.train_loader, self.val_loader = build_dataloaders(
                self.config, self.tokenizer, data.dp_rank(me), data.dp_size)

    def holds_rows_of(self, node_id: str) -> bool:
        """Whether this worker's output of ``node_id`` is its own share of the rows (not a
        tensor-parallel peer's copy), e.g. for writing them out once."""
        layout = self._layouts.get(node_id)
        me = self.comm.rank if self.process_groups is not None else self.rank
        return layout is None or layout.is_source(me)

    def process_group(self, role: str) -> Any:
        """The torch.distributed group an engine of ``role`` shards and reduces over
        (None: the default group, or no distributed run at all)."""
        if self.process_groups is None:
            return None
        return self.process_groups.group_for(role)

    def sequence_parallel_groups(self, size: int) -> Any:
        """(sequence-parallel group, data-parallel group) of this worker for Ulysses groups
        of ``size`` consecutive workers; None without process groups."""
        if self.process_groups is None:
            return None
        return self.process_groups.sequence_groups(size)

    def can_validate(self) -> bool:
        roles = self.agents.all_roles()
        return ("rollout" in roles and "reward" in roles) or \
            self.scored_rollout() is not None

    def scored_rollout(self) -> Optional[Callable[[Any], NodeOutput]]:
        """Validation through the graph's own rollout node, when it is not the worker's
        ``generate`` and scores its rows itself (it takes ``validate``, e.g. the AGENTIC
        node, whose rows carry their episodes' rewards): ``batch -> NodeOutput``."""
        import inspect

        from siirl.execution.dag.node import NodeRole

        node = next((n for n in self.taskgraph.nodes.values()
                     if n.node_role is NodeRole.ROLLOUT), None)
        if node is None or (node.executable_ref or "").startswith(
                "siirl.dag_worker.dagworker:"):
            return None
        func = self.executor.callable_for(node)
        try:
            accepted = inspect.signature(func).parameters
        except (TypeError, ValueError):
            return None
        if "validate" not in accepted:
            return None
        extra = {k: v for k, v in (("worker", self), ("node", node)) if k in accepted}
        return lambda batch: func(batch, config=self.config, validate=True, **extra)

    def set_total_training_steps(self, steps: int) -> None:
        """Engines with a learning-rate schedule need the run's length."""
        for group in self.agents.ids:
            for role in self.agents.roles(group):
                engine = self.agents.engines[group].get(role)
                if hasattr(engine, "set_total_training_steps"):
                    engine.set_total_training_steps(steps)

    def algorithm_state(self) -> Dict[str, Any]:
        return {name: obj.state_dict() for name, obj in self.algorithm_objects.items()}

    def load_algorithm_state(self, state: Dict[str, Any]) -> None:
        for name, obj in self.algorithm_objects.items():
            if name in state:
                obj.load_state_dict(state[name])

    def execute_task_graph(self, batch: Any = None,
                           next_batch: Optional[Callable[[], Any]] = None) -> StepResult:
        """Run every node once in topological order; return exit outputs and step metrics.

        ``next_batch`` supplies further batches when a node asks to regenerate."""
        self.metrics.reset()
        self.step_state = {}
        start = time.perf_counter()
        while True:
            exits = self._run_graph(batch)
            if exits is not None:
                break
            if next_batch is None:
                raise PipelineError("a node asked to regenerate (info['regenerate']) but this "
                                    "run has no further batches to give it")
            batch = next_batch()
        self.metrics.add("timing_s/step", time.perf_counter() - start)
        return StepResult(outputs=exits, metrics=self.metrics.result())

    def _run_graph(self, batch: Any) -> Optional[Dict[str, NodeOutput]]:
        """One pass over the graph; None when a node asked for a new batch."""
        graph = self.taskgraph
        outputs: Dict[str, Any] = {}  # node_id -> batch handed to its children
        pending_children = {node_id: len(graph.adj[node_id]) for node_id in self._order}
        exits: Dict[str, NodeOutput] = {}
        for node_id in self._order:
            node = graph.nodes[node_id]
            if node.dependencies:
                node_input = merge_parent_batches(
                    node_id, [self._moved(outputs[dep], dep, node_id)
                              for dep in node.dependencies])
            else:
                node_input = batch
            if self.agents.planned_out(node, self.global_step):
                output = NodeOutput(batch=None)  # planned for some steps only
            else:
                output = self._run_planned(node, node_input)
            if (output.info or {}).get("regenerate"):
                return None
            outputs[node_id] = node_input if output.batch is None else output.batch
            if not graph.adj[node_id]:
                exits[node_id] = NodeOutput(outputs[node_id], output.metrics, output.info)
            for dep in node.dependencies:  # free a parent's batch once its children ran
                pending_children[dep] -= 1
                if pending_children[dep] == 0:
                    outputs.pop(dep, None)
        return exits

    def _run_planned(self, node: Any, batch: Any) -> NodeOutput:
        """Run ``node``, timed, with the weight-sync steps planned before and after it."""
        if ("before", node.node_id) in self._syncs:
            self.sync_rollout_weights()
        output, seconds = self._run_node(node, batch)
        self.metrics.add_node(node.node_id, output.metrics, seconds,
                              user_node=self.executor.is_user_node(node))
        if ("after", node.node_id) in self._syncs:
            self.sync_rollout_weights()
        return output

    def _run_node(self, node: Any, batch: Any) -> tuple:
        """Run one node with its agent group's engines; in a multi-agent graph on its
        agent's view of the batch (``agent_groups``), its metrics named by agent group."""
        agents = self.agents
        if not agents.multi:
            return self.executor.run(node, batch, self.config)
        group = node.agent_group
        if agents.skips_training(node, self.global_step):
            return NodeOutput(batch=batch, metrics={
                f"agent_group_{group}/{node.node_id}/train_cycle_skipped": 1.0}), 0.0
        self.agent_group = group
        try:
            config = agents.configs[group]
            if sees_all_agents(self.executor.callable_for(node)):
                output, seconds = self.executor.run(node, batch, config)
                return output, seconds
            view = agents.view(batch, group) if batch is not None else None
            before = agents.snapshot(view) if view is not None else {}
            output, seconds = self.executor.run(node, view, config)
            # a node returning no batch changed its input in place (or nothing)
            out = view if output.batch is None else output.batch
            merged = agents.merge(batch, before, out, group) if batch is not None else out
            return NodeOutput(merged, agents.metric_names(group, output.metrics),
                              output.info), seconds
        finally:
            self.agent_group = agents.ids[0]

    def sync_rollout_weights(self) -> None:
        """The weight-sync step the planner inserts (and validation runs first): when an
        actor's weights changed since its rollout last took them, hand them over now (timed
        as ``timing_s/weight_sync``)."""
        for sync in self._weight_syncs.values():
            if sync.needed():
                for name, value in sync.run().items():
                    self.metrics.accumulate(name, value)

    def _moved(self, batch: Any, parent: str, child: str) -> Any:
        """``parent``'s output laid out as ``child`` needs it (the same object when the
        layouts agree; a DataBuffer transfer, a collective over the graph's workers, else)."""
        src, dst = self._layouts.get(parent), self._layouts.get(child)
        if src is None or src == dst:
            return batch
        if self._buffer is None:
            from siirl.data_coordinator.data_buffer import DataBuffer

            group = self.process_groups.control_group if self.process_groups else None
            self._buffer = DataBuffer(group)
        traffic = self._buffer.traffic
        sent, shared = traffic.bytes_sent, traffic.shared_bytes
        start = time.perf_counter()
        batch = self._common_prompt_width(batch, src)
        # each source's rows are its share of the loader's chunks: kept apart, so that the
        # training workers' k-th mini-batches remain one worker's k-th
        chunks = int(getattr(self.train_loader, "mini_batches", 1) or 1)
        moved = self._buffer.redistribute(batch, src, dst, group_key=UID, chunks=chunks)
        # bytes over the network transport, and bytes staged in same-node shared memory
        self.metrics.add(f"databuffer/{child}/bytes_sent", traffic.bytes_sent - sent)
        self.metrics.add(f"databuffer/{child}/shared_bytes", traffic.shared_bytes - shared)
        self.metrics.add(f"timing_s/databuffer/{child}", time.perf_counter() - start)
        return moved

    def _common_prompt_width(self, batch: Any, src: Any) -> Any:
        """Prompts are left-padded to the longest prompt of each worker's own batch; rows
        moving between workers need one width, so the prompt-side fields are left-padded
        to the widest source's first (a small all-gather of widths)."""
        import torch.distributed as dist

        from siirl.data_coordinator.protocol import left_pad_to

        pads = {INPUT_IDS: getattr(self.tokenizer, "pad_token_id", None) or 0,
                PROMPTS: getattr(self.tokenizer, "pad_token_id", None) or 0,
                ATTENTION_MASK: 0, POSITION_IDS: 0}
        mine = {key: int(batch.get(key).shape[-1]) for key in pads
                if batch is not None and src.is_source(self.comm.rank) and key in batch.keys()}
        group = self._buffer.group
        gathered: list = [None] * dist.get_world_size(group)
        dist.all_gather_object(gathered, mine, group=group)
        widths: Dict[str, int] = {}
        for part in gathered:
            for key, width in part.items():
                widths[key] = max(widths.get(key, 0), width)
        return left_pad_to(batch, widths, pads) if batch is not None else batch

    # ---- built-in node functions: each delegates to the engine of its role -------------

    def generate(self, batch, config=None, **kwargs) -> NodeOutput:
        return self.engines.rollout.generate(batch)

    def compute_reward(self, batch, config=None, **kwargs) -> NodeOutput:
        if self.agents.multi and ENV_SCORES in batch.keys():
            from siirl.dag_worker.multi_agent.rollout import (
                env_rewards,
                rewards_with_env,
            )

            if rewards_with_env(config if config is not None else self.config,
                                self.taskgraph):  # the environment scored the episodes
                return NodeOutput(batch=env_rewards(batch),
                                  metrics={"reward/env_score/mean": batch[ENV_SCORES].mean()})
        return remax_baseline.score_rows(self.engines, batch)

    def generate_greedy_baseline(self, batch, config=None, **kwargs) -> NodeOutput:
        """ReMax: one greedy reply per prompt (see remax_baseline)."""
        return remax_baseline.greedy_baseline_rollout(self, batch)

    def compute_reward_baseline(self, batch, config=None, **kwargs) -> NodeOutput:
        """ReMax: the greedy replies' scores as ``reward_baselines`` (see remax_baseline)."""
        return remax_baseline.score_greedy_baseline(self, batch)

    def compute_old_log_prob(self, batch, config=None, **kwargs) -> NodeOutput:
        return self.engines.actor.compute_log_prob(batch)

    def compute_ref_log_prob(self, batch, config=None, **kwargs) -> NodeOutput:
        return self.engines.reference.compute_ref_log_prob(batch)

    def compute_value(self, batch, config=None, **kwargs) -> NodeOutput:
        return self.engines.critic.compute_values(batch)

    def train_actor(self, batch, config=None, **kwargs) -> NodeOutput:
        if algorithm_nodes.actor_warming_up(self, config if config is not None else self.config):
            return NodeOutput(batch=batch, metrics={"actor/critic_warmup": 1.0})
        return self.engines.actor.update_policy(batch)

    def train_critic(self, batch, config=None, **kwargs) -> NodeOutput:
        return self.engines.critic.update_critic(batch)

    def compute_advantage(self, batch, config=None, **kwargs) -> NodeOutput:
        """Advantages and returns by ``algorithm.adv_estimator`` (see algorithm_nodes); in
        a multi-agent graph for every agent group (``multi_agent_advantage``)."""
        config = config if config is not None else self.config
        if self.agents.multi:
            from siirl.dag_worker.multi_agent.advantage import compute_agents_advantage

            return compute_agents_advantage(self, batch, config, kwargs.get("node"))
        return algorithm_nodes.compute_advantage(self, batch, config, kwargs.get("node"))

    compute_advantage.__siirl_all_agents__ = True

    def __repr__(self) -> str:
        return f"DAGWorker(rank={self.rank}/{self.world_size}, graph={self.taskgraph.graph_id})"

