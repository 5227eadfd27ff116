"""Asynchronous training (verl's fully-async keys, with verl's meanings): the rollout
runs on its own workers (``rollout.nnodes * rollout.n_gpus_per_node``) beside the
trainer's (``trainer.nnodes * trainer.n_gpus_per_node``), and the two overlap.

Where siiRL differs from verl: ``async_training.enable`` switches it on (verl chooses by
entry point); a trainer step trains ``require_batches * actor.ppo_mini_batch_size``
prompts, and ``data.train_batch_size`` is set to that number (verl ignores it); the
rollout validates after each weight sync that crosses a multiple of
``trainer.test_freq`` (verl: ``rollout.test_freq``).
"""

from dataclasses import dataclass, field


@dataclass
class AsyncTrainingArguments:
    """verl's ``async_training`` section (its fully-async trainer), plus siiRL's switch."""

    enable: bool = field(default=False, metadata={
        "help": "siiRL: train asynchronously, the rollout sub-graph on the rollout.* "
                "workers, the training sub-graph on the trainer.* workers"})
    staleness_threshold: float = field(default=0.0, metadata={
        "help": "verl: between two weight syncs the rollout generates at most (1 + this) x "
                "the prompts the trainer consumes in that time; 0 is synchronous streaming, "
                "1 about one-step-off-policy"})
    trigger_parameter_sync_step: int = field(default=1, metadata={
        "help": "verl: trainer steps (local updates) between two weight syncs (siiRL: "
                "the policy lag stays within k * (ceil(staleness_threshold) + 1) - 1; a "
                "sample beyond it is dropped and generated again)"})
    require_batches: int = field(default=1, metadata={
        "help": "verl: a trainer step trains this many actor.ppo_mini_batch_size batches "
                "of prompt groups (siiRL: data.train_batch_size must equal their product; "
                "verl ignores it)"})
    partial_rollout: bool = field(default=False, metadata={
        "help": "verl: pause in-flight generations at a weight sync and go on under the "
                "new weights (siiRL: the hf rollout; each token records its version)"})


@dataclass
class RolloutPoolArguments:
    """verl's root ``rollout`` section of the fully-async trainer: the rollout workers."""

    nnodes: int = field(default=1, metadata={"help": "Nodes of the rollout workers "
                                             "(async_training.enable)."})
    n_gpus_per_node: int = field(default=1, metadata={
        "help": "Rollout workers per node (async_training.enable); CPU processes with "
                "trainer.device=cpu."})
