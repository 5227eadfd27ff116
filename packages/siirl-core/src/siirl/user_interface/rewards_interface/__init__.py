"""Example custom reward functions, for ``custom_reward_function.path`` / ``.name``.

A reward function is ``compute_score(data_source, solution_str, ground_truth,
extra_info=None, **reward_kwargs) -> float | dict`` (a dict needs a "score" key; its
other keys become per-row batch fields, e.g. "acc"). These files import nothing from
``siirl.engine``, so they work as plain files copied anywhere.
"""
