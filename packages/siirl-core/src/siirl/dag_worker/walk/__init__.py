"""The walk of the graph: what a DAGWorker does each step around its nodes (calling a node,
engines, data, weight sync, validation, metrics, logging, the training loop)."""
