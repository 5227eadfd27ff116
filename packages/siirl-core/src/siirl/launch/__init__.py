"""Start a training job: the ``siirl-train`` CLI, config loading and process start-up.

The top layer of siirl-core: it may import ``siirl.execution`` (DAG, planner) and
``siirl.dag_worker`` (the per-device worker); neither of them imports it.

- ``cli``: argument parsing, usage text, error reporting (``siirl-train``,
  ``python -m siirl.main_dag``)
- ``config``: the resolved configuration from defaults, a preset and overrides
- ``job``: load the pipeline, plan it over the workers, start them
- ``ray_launcher`` / ``worker_process``: more than one worker, as Ray actors
"""
