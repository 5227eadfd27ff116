"""The embodied accuracy-filter node, under the path siiRL's documentation gives for it
(``siirl.user_interface.filter_interface.embodied:embodied_local_rank_sampling``). The node is
built in and lives with the other built-in nodes (``siirl.dag_worker.nodes.embodied_filter``);
this module re-exports it so workflow files naming this path keep working."""

from siirl.dag_worker.nodes.embodied_filter import embodied_local_rank_sampling

__all__ = ["embodied_local_rank_sampling"]
