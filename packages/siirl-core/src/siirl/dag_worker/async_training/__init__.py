"""Asynchronous training: the rollout sub-graph on rollout workers, the training sub-graph
on trainer workers, scored prompt groups streamed between them with the policy version
that generated them (``siirl.execution.dag.async_split`` makes the plan)."""
