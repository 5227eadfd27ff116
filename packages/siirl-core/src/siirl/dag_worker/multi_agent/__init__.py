"""Multi-agent rollouts: the rollout nodes of several agent groups play one episode in turn
(``rollout.multi_agent_rollout``), each agent's prompt shaped by its process file and the
episode stepped by an optional environment class (``agent_process``)."""
