"""The reliability corpus's bad reward code (``cases.py`` lists every case)."""

from __future__ import annotations

from typing import Tuple

from corpus_model import Case

# ---------------------------------------------------------------------------------------
# bad reward code: contained (the sample scores 0, counted in reward/errors) under every
# manager; a run where every sample fails stops after reward_model.max_failed_steps
# ---------------------------------------------------------------------------------------

# how both reward files below start: the first sample ever scored is the bad one (_is_bad)
BAD_SAMPLE = '''import ctypes, math, os, signal, sys, time

BAD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bad_sample.txt")


def _is_bad(extra_info, solution_str):
    """The first sample ever scored is the bad one: it fails every time it is scored
    (retried alone too), every other sample scores normally."""
    index = extra_info.get("index") if isinstance(extra_info, dict) else None
    key = "%s|%s" % (index, solution_str)
    try:
        fd = os.open(BAD, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        os.write(fd, key.encode())
        os.close(fd)
        return True
    except FileExistsError:
        with open(BAD) as fh:
            return fh.read() == key
'''

ROW_FN = '''"""A user reward function with a bug (reliability corpus)."""
''' + BAD_SAMPLE + '''

def _fault_now(extra_info, solution_str):
    {select}


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if _fault_now(extra_info, solution_str):
        {fault}
    return float(solution_str.strip().startswith(str(ground_truth)))
'''

BATCH_FN = '''"""A batch reward function with a bug (reliability corpus)."""
''' + BAD_SAMPLE + '''

def compute_score(data_sources, solution_strs, ground_truths, extra_infos, **kwargs):
    scores = [float(s.strip().startswith(str(g))) for s, g in zip(solution_strs, ground_truths)]
    if {select}:
        {fault}
    return scores
'''

SELECT = {"once": "return _is_bad(extra_info, solution_str)",  # one sample of the run
          "quarter": "return (extra_info or {}).get('index', 0) % 4 == 0",
          "always": "return True"}
FAULTS = {
    "raise": ('raise ValueError("bad sample")', "raises ValueError"),
    "sys_exit": ("sys.exit(0)", "calls `sys.exit(0)`"),
    "os_exit": ("os._exit(0)", "calls `os._exit(0)`"),
    "sigkill": ("os.kill(os.getpid(), signal.SIGKILL)", "kills itself with SIGKILL"),
    "segfault": ("ctypes.string_at(0)", "segfaults (`ctypes.string_at(0)`)"),
    "hang": ("time.sleep(3600)", "hangs (with `timeout_s=2`)"),
    "nan": ('return float("nan")', "returns NaN"),
    "inf": ('return float("inf")', "returns inf"),
    "huge": ("return 1e300", "returns 1e300"),
    "string": ('return "0.5"', 'returns the string `"0.5"`'),
    "none": ("return None", "returns None"),
}
# what the warning (or the final error) must say about the cause
CAUSE = {
    "raise": r"ValueError|bad (sample|batch)",
    "sys_exit": r"exit",
    "os_exit": r"exit|died|crash",
    "sigkill": r"SIGKILL|signal|killed|died|crash",
    "segfault": r"SIGSEGV|segfault|segmentation|signal|died|crash",
    "hang": r"time-?out|timed out",
    "nan": r"\bnan\b|finite",
    "inf": r"\binf\b|finite",
    "huge": r"1e\+?300|finite|overflow|skip",
    "string": r"\bstr\b|string|numeric|number|0\.5",
    "none": r"None|numeric|number",
}
HOW_OFTEN = {"once": "for one particular sample", "quarter": "for a quarter of the samples",
             "always": "for every sample"}
CONTAINED = ("contained: that sample scores 0, counted in `reward/errors/<kind>`, one warning "
             "with an example; the run finishes")
FN_ARGS = ("custom_reward_function.path={tmp}/reward.py",
           "custom_reward_function.name=compute_score")
TIMEOUT = ("+custom_reward_function.reward_kwargs.timeout_s=2",)


def reward_case(manager: str, fault: str, select: str) -> Case:
    statement, what = FAULTS[fault]
    argv = (*FN_ARGS, f"reward_model.reward_manager={manager}",
            *(TIMEOUT if fault == "hang" else ()))
    checks: Tuple[str, ...] = ("steps_once", "reward_errors")
    says = CONTAINED
    if fault == "huge":  # finite, but no advantage survives it: counted, never silent
        checks = ("no_duplicates", "counted")
        says = ("contained: the sample (or its step) is counted in `reward/errors` or "
                "`train/skipped_steps` and explained; the run finishes")
    return Case(f"reward_{manager}_{fault}", "reward",
                f"`{manager}` manager: the reward function {what} {HOW_OFTEN[select]}", says,
                0, message=(r"reward", CAUSE[fault]), argv=argv, checks=checks,
                whole_stderr=True,
                files={"reward.py": ROW_FN.format(select=SELECT[select], fault=statement)})


BATCH_FAULTS = {
    "raise": ('raise ValueError("bad batch")', "raises ValueError"),
    "sys_exit": ("sys.exit(0)", "calls `sys.exit(0)`"),
    "os_exit": ("os._exit(0)", "calls `os._exit(0)`"),
    "segfault": ("ctypes.string_at(0)", "segfaults"),
    "hang": ("time.sleep(3600)", "hangs (with `timeout_s=2`)"),
}


def batch_case(fault: str) -> Case:
    statement, what = BATCH_FAULTS[fault]
    argv = (*FN_ARGS, "reward_model.reward_manager=batch", *(TIMEOUT if fault == "hang" else ()))
    select = "any(_is_bad(e, s) for e, s in zip(extra_infos, solution_strs))"
    return Case(f"reward_batch_{fault}", "reward",
                f"`batch` manager: the batch function {what} whenever its batch holds one "
                "particular sample", CONTAINED, 0,
                message=(r"reward", CAUSE[fault]), argv=argv,
                checks=("steps_once", "reward_errors"), whole_stderr=True,
                files={"reward.py": BATCH_FN.format(select=select, fault=statement)})


STOPS = "stops after `reward_model.max_failed_steps` steps in which every sample failed"

REWARD = [
    *(reward_case("naive", f, "quarter") for f in ("raise", "nan", "inf", "huge", "string",
                                                     "none")),
    *(reward_case("naive", f, "once") for f in ("sys_exit", "os_exit", "sigkill", "segfault",
                                                  "hang")),
    *(reward_case("parallel", f, "quarter") for f in ("raise", "nan", "string")),
    *(reward_case("parallel", f, "once") for f in ("sys_exit", "os_exit", "segfault", "hang")),
    *(batch_case(f) for f in BATCH_FAULTS),
    Case("reward_batch_nan_one", "reward", "`batch` manager: one NaN in every returned list",
         CONTAINED, 0, message=(r"reward", CAUSE["nan"]),
         argv=(*FN_ARGS, "reward_model.reward_manager=batch"),
         checks=("steps_once", "reward_errors"), whole_stderr=True,
         files={"reward.py": BATCH_FN.format(select="scores",
                                             fault='scores[0] = float("nan")')}),
    Case("reward_batch_wrong_length", "reward",
         "`batch` manager: the function returns one score too few", "names the function, "
         "the file and both lengths", (1, 2),
         message=(r"reward\.py|compute_score", rf"\b{16 * 4 - 1}\b", rf"\b{16 * 4}\b"),
         argv=(*FN_ARGS, "reward_model.reward_manager=batch"),
         files={"reward.py": BATCH_FN.format(select="scores", fault="scores.pop()")}),
    Case("reward_naive_raise_always", "reward",
         "`naive` manager: the reward function raises for every sample", STOPS, 1,
         message=(r"max_failed_steps", r"ValueError|bad sample"),
         argv=(*FN_ARGS, "reward_model.max_failed_steps=2", "trainer.total_training_steps=6"),
         checks=("no_duplicates_so_far",),
         files={"reward.py": ROW_FN.format(select=SELECT["always"],
                                           fault=FAULTS["raise"][0])}),
    Case("reward_naive_exit_always", "reward",
         "`naive` manager: the reward function calls `sys.exit(0)` for every sample", STOPS, 1,
         message=(r"max_failed_steps", r"exit"),
         argv=(*FN_ARGS, "reward_model.max_failed_steps=2", "trainer.total_training_steps=6"),
         checks=("no_duplicates_so_far",),
         files={"reward.py": ROW_FN.format(select=SELECT["always"],
                                           fault=FAULTS["sys_exit"][0])}),
    Case("reward_parallel_hang_always", "reward",
         "`parallel` manager: the reward function hangs for every sample (`timeout_s=1`)",
         STOPS, 1, message=(r"max_failed_steps", r"timeout|timed out|time"),
         argv=(*FN_ARGS, "reward_model.reward_manager=parallel",
               "reward_model.max_failed_steps=1", "trainer.total_training_steps=4",
               "+custom_reward_function.reward_kwargs.timeout_s=1"),
         checks=("no_duplicates_so_far",),
         files={"reward.py": ROW_FN.format(select=SELECT["always"],
                                           fault=FAULTS["hang"][0])}),
    Case("reward_file_import_error", "reward",
         "a reward file that fails to import (`import not_a_module`)",
         "names the file and the import error", 2,
         message=(r"reward\.py", r"not_a_module"), argv=FN_ARGS,
         files={"reward.py": "import not_a_module\n\ndef compute_score(*a, **k):\n"
                             "    return 0.0\n"}),
    Case("reward_file_syntax_error", "reward", "a reward file with a syntax error",
         "names the file and the syntax error", 2, message=(r"reward\.py", r"syntax"),
         argv=FN_ARGS, files={"reward.py": "def compute_score(:\n    return 0.0\n"}),
    Case("reward_function_missing", "reward",
         "`custom_reward_function.name=score` where the file defines `compute_score`",
         "names the function, the file and the functions it has", 2,
         message=(r"'?score'?", r"reward\.py", r"compute_score"),
         argv=(*FN_ARGS, "custom_reward_function.name=score"),
         files={"reward.py": ROW_FN.format(select="return False", fault="pass")}),
    Case("reward_file_missing", "reward",
         "`custom_reward_function.path` naming a file that does not exist",
         "names the key and the path", 2,
         message=(r"custom_reward_function\.path", r"nope\.py"),
         argv=("custom_reward_function.path={tmp}/nope.py",)),
]
