"""DAPO's dynamic-sampling node, under the path siiRL's documentation gives for it
(``siirl.user_interface.filter_interface.dapo:dynamic_sampling``). The node is built in and
lives with the other built-in nodes (``siirl.dag_worker.nodes.dapo_filter``); this module
re-exports it so workflow files naming this path keep working."""

from siirl.dag_worker.nodes.dapo_filter import dynamic_sampling

__all__ = ["dynamic_sampling"]
