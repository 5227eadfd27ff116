"""User reward functions for the end-to-end tests: one raises, one hangs, for some rows."""

import time


def flaky_score(data_source, solution_str, ground_truth, extra_info=None):
    index = (extra_info or {}).get("index", 0)
    if index % 3 == 0:
        raise RuntimeError("user reward bug")
    if index % 3 == 1:
        time.sleep(3600)
    return float(solution_str.strip().startswith(str(ground_truth)))
