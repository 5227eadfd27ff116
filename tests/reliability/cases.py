"""The reliability corpus: what a new user or an unlucky operator does to the main job, and
what siiRL must do about it (issue 16, item 10).

Each ``Case`` is one real ``python -m siirl.main_dag`` run (``test_corpus.py`` runs them):
the main job at CI size (``BASE``) plus the case's overrides, in a fresh folder that holds
the files the case writes. Every case asserts the exit status, that the tail of stderr
names the cause (``message``: regexes that must all match), that no traceback is printed
and that committed checkpoints and metrics are intact (``checks``).

``tools/reliability_table.py`` renders the "What happens when..." table of docs/reliability.md
from this list, so a case's ``did`` and ``says`` are written for a reader of that page.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple, Union

CLASSES = {
    "config": "bad config",
    "data": "bad data",
    "reward": "bad reward code",
    "checkpoint": "bad checkpoints",
    "disk": "disk faults",
    "signal": "signals",
    "worker": "worker faults",
}

# The main job at CI size; ``{run}`` is the run folder, ``{tmp}`` the case's folder.
BASE = ("trainer.default_local_dir={run}", "data.train_batch_size=16",
        "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=16",
        "trainer.logger=[]", "trainer.val_before_train=false", "trainer.device=cpu",
        "trainer.total_training_steps=2", "trainer.test_freq=-1", "trainer.save_freq=-1")
# Long enough to be interrupted; a checkpoint every 2 steps.
LONG = ("trainer.total_training_steps=500", "trainer.save_freq=2")
TWO_WORKERS = ("trainer.n_gpus_per_node=2", "trainer.ray_address=local",
               "trainer.ray_temp_dir={ray}")

FileContent = Union[str, bytes, Callable[[Path], None]]

# Names of the extra checks (test_corpus.py implements them):
#   steps_once        metrics.jsonl has training steps 1..N, each once (N: total steps)
#   no_duplicates     no training step is logged twice, and the last step N is there
#   reward_errors     some step counted reward/errors > 0, with a reward/errors/<kind> > 0
#   counted           reward/errors or train/skipped_steps is > 0 somewhere (not silent)
#   committed_intact  checkpoints committed before the run (and not damaged by the case)
#                     are still there, byte for byte; every global_step_* has COMMITTED
#   new_checkpoint    the run committed a checkpoint of its last step N
#   no_code_ran       a checkpoint's pickled payload did not run (no {tmp}/PWNED)
#   no_duplicates_so_far  no training step is logged twice (a run that stopped early)
# and, for every case: no ``.global_step_*.partial`` folder is left behind.


@dataclass(frozen=True)
class Fault:
    """Something done to the running job: ``action`` once ``after_steps`` training steps
    are in metrics.jsonl (or ``after_s`` seconds after the start, when set)."""

    action: str  # sigterm | sigint | sigint_twice | sigkill | stop_worker | kill_worker
    after_steps: int = 3
    after_s: Optional[float] = None


@dataclass(frozen=True)
class Case:
    id: str
    kind: str  # a key of CLASSES
    did: str  # what the user did, one line (docs/reliability.md)
    says: str  # what siiRL does, in words (the page too): the cause it names, or how it contains
    exit: Union[int, Tuple[int, ...]]  # expected exit status (a tuple: any of these)
    message: Tuple[str, ...] = ()  # regexes (case-insensitive) the end of stderr must match
    argv: Tuple[str, ...] = ()  # overrides after BASE (a later key wins)
    files: Dict[str, FileContent] = field(default_factory=dict)  # written under {tmp}
    checks: Tuple[str, ...] = ()
    fast: bool = False  # rejected before anything loads: runs in CI
    seed: bool = False  # start from a run folder with committed checkpoints of steps 1, 2
    damage: Optional[Callable[[Path], None]] = None  # applied to the run folder first
    damaged: Tuple[str, ...] = ()  # checkpoints the damage touched (not checked intact)
    fault: Optional[Fault] = None
    then: Optional[Tuple[str, ...]] = None  # overrides of a second run that must exit 0
    workers: int = 1
    unprivileged: bool = False  # run without root's override of file permissions
    file_size_limit: Optional[int] = None  # RLIMIT_FSIZE of the run, bytes
    timeout_s: float = 240.0
    whole_stderr: bool = False  # match ``message`` anywhere in stderr (warnings of a run
    # that finished), not only in its last lines

    def argv_for(self, tmp: Path, run: Path, ray: str = "") -> list:
        extra = TWO_WORKERS if self.workers == 2 else ()
        return [a.format(tmp=tmp, run=run, ray=ray) for a in (*BASE, *extra, *self.argv)]

    def total_steps(self, argv: list) -> int:
        return int([a for a in argv if a.startswith("trainer.total_training_steps=")][-1]
                   .split("=", 1)[1])


def esc(text: str) -> str:
    return re.escape(str(text))


def key_value(key: str, value) -> str:
    """The key and its value on one line, in either order (the value as a whole token)."""
    k, v = esc(key), rf"(?<![\w.-]){esc(value)}(?![\w.])"
    return rf"{k}[^\n]*{v}|{v}[^\n]*{k}"


# ---------------------------------------------------------------------------------------
# bad config: one validation pass before anything loads; exit 2; key, value and rule named
# ---------------------------------------------------------------------------------------

NAMES = "names the key, its value and the rule"


def bad_value(cid: str, did: str, key: str, value, *more: str, rule_hint: str = "",
              fast: bool = True) -> Case:
    shown = str(value).lower() if isinstance(value, bool) else str(value)
    return Case(cid, "config", did, NAMES + rule_hint, 2,
                message=(key_value(key, shown),), argv=(f"{key}={shown}", *more), fast=fast)


CONFIG = [
    bad_value("config_batch_zero", "`data.train_batch_size=0`", "data.train_batch_size", 0),
    bad_value("config_batch_negative", "`data.train_batch_size=-16`",
              "data.train_batch_size", -16),
    bad_value("config_rollout_n_zero", "`actor_rollout_ref.rollout.n=0`",
              "actor_rollout_ref.rollout.n", 0),
    bad_value("config_rollout_n_negative", "`actor_rollout_ref.rollout.n=-4`",
              "actor_rollout_ref.rollout.n", -4),
    bad_value("config_mini_batch_zero", "`actor_rollout_ref.actor.ppo_mini_batch_size=0`",
              "actor_rollout_ref.actor.ppo_mini_batch_size", 0),
    bad_value("config_mini_batch_indivisible",
              "a PPO mini-batch (12) that does not divide the batch (16)",
              "actor_rollout_ref.actor.ppo_mini_batch_size", 12),
    bad_value("config_mini_batch_larger", "a PPO mini-batch (32) larger than the batch (16)",
              "actor_rollout_ref.actor.ppo_mini_batch_size", 32),
    bad_value("config_micro_batch_zero",
              "`actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=0`",
              "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", 0),
    bad_value("config_gen_batch_zero", "`data.gen_batch_size=0`", "data.gen_batch_size", 0),
    bad_value("config_val_batch_zero", "`data.val_batch_size=0`", "data.val_batch_size", 0),
    bad_value("config_response_length_zero", "`data.max_response_length=0`",
              "data.max_response_length", 0),
    bad_value("config_prompt_length_negative", "`data.max_prompt_length=-1`",
              "data.max_prompt_length", -1),
    bad_value("config_response_length_mismatch",
              "a rollout response length (16) unlike `data.max_response_length` (8)",
              "actor_rollout_ref.rollout.response_length", 16),
    bad_value("config_lr_nan", "`actor_rollout_ref.actor.optim.lr=nan`",
              "actor_rollout_ref.actor.optim.lr", "nan"),
    bad_value("config_lr_inf", "`actor_rollout_ref.actor.optim.lr=inf`",
              "actor_rollout_ref.actor.optim.lr", "inf"),
    bad_value("config_lr_negative", "a negative learning rate",
              "actor_rollout_ref.actor.optim.lr", -0.001),
    bad_value("config_weight_decay_negative", "a negative weight decay",
              "actor_rollout_ref.actor.optim.weight_decay", -0.01),
    Case("config_betas_outside", "config", "Adam betas `[0.9,1.5]`", NAMES, 2,
         message=(esc("actor_rollout_ref.actor.optim.betas"), r"1\.5"),
         argv=("actor_rollout_ref.actor.optim.betas=[0.9,1.5]",), fast=True),
    bad_value("config_warmup_ratio_outside", "a warm-up ratio of 1.5",
              "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio", 1.5),
    bad_value("config_clip_ratio_negative", "a negative PPO clip ratio",
              "actor_rollout_ref.actor.clip_ratio", -0.2),
    bad_value("config_clip_low_negative", "a negative lower clip ratio",
              "actor_rollout_ref.actor.clip_ratio_low", -0.1),
    bad_value("config_dual_clip_below_one", "a dual-clip constant below 1",
              "actor_rollout_ref.actor.clip_ratio_c", 0.5),
    Case("config_clip_cov_inverted", "config",
         "an inverted clip range (`clip_cov_lb=6` above `clip_cov_ub=1`)", NAMES, 2,
         message=(r"clip_cov_lb", r"clip_cov_ub"),
         argv=("actor_rollout_ref.actor.policy_loss.loss_mode=clip_cov",
               "actor_rollout_ref.actor.policy_loss.clip_cov_lb=6.0",
               "actor_rollout_ref.actor.policy_loss.clip_cov_ub=1.0"), fast=True),
    Case("config_accuracy_bounds_inverted", "config",
         "an inverted accuracy filter (lower bound 0.9 above upper bound 0.1)", NAMES, 2,
         message=(r"accuracy_lower_bound", r"accuracy_upper_bound"),
         argv=("algorithm.embodied_sampling.accuracy_lower_bound=0.9",
               "algorithm.embodied_sampling.accuracy_upper_bound=0.1"), fast=True),
    bad_value("config_top_p_above_one", "`rollout.top_p=1.5` (a probability above 1)",
              "actor_rollout_ref.rollout.top_p", 1.5),
    bad_value("config_top_p_negative", "`rollout.top_p=-0.1`",
              "actor_rollout_ref.rollout.top_p", -0.1),
    bad_value("config_temperature_negative", "a negative sampling temperature",
              "actor_rollout_ref.rollout.temperature", -1.0),
    bad_value("config_gpu_memory_above_one", "`rollout.gpu_memory_utilization=1.5`",
              "actor_rollout_ref.rollout.gpu_memory_utilization", 1.5),
    bad_value("config_gamma_above_one", "a discount `algorithm.gamma=1.5`", "algorithm.gamma",
              1.5),
    bad_value("config_lam_negative", "`algorithm.lam=-0.5`", "algorithm.lam", -0.5),
    bad_value("config_grad_clip_negative", "a negative gradient clip",
              "actor_rollout_ref.actor.grad_clip", -1.0),
    bad_value("config_kl_coef_negative", "a negative KL loss coefficient",
              "actor_rollout_ref.actor.kl_loss_coef", -0.001,
              "actor_rollout_ref.actor.use_kl_loss=true"),
    bad_value("config_entropy_coeff_inf", "an infinite entropy coefficient",
              "actor_rollout_ref.actor.entropy_coeff", "inf"),
    bad_value("config_ppo_epochs_zero", "`actor_rollout_ref.actor.ppo_epochs=0`",
              "actor_rollout_ref.actor.ppo_epochs", 0),
    bad_value("config_total_steps_negative", "`trainer.total_training_steps=-5`",
              "trainer.total_training_steps", -5),
    bad_value("config_total_epochs_zero", "`trainer.total_epochs=0`", "trainer.total_epochs", 0),
    bad_value("config_gpus_zero", "`trainer.n_gpus_per_node=0`", "trainer.n_gpus_per_node", 0),
    bad_value("config_nnodes_zero", "`trainer.nnodes=0`", "trainer.nnodes", 0),
    bad_value("config_heartbeat_negative", "a negative heartbeat timeout",
              "trainer.heartbeat_timeout_s", -1.0),
    bad_value("config_dist_timeout_zero", "`trainer.dist_timeout_s=0`",
              "trainer.dist_timeout_s", 0),
    bad_value("config_cpu_threads_zero", "`trainer.cpu_threads=0`", "trainer.cpu_threads", 0),
    bad_value("config_loader_workers_negative", "`data.dataloader_num_workers=-1`",
              "data.dataloader_num_workers", -1),
    Case("config_many_errors", "config",
         "three mistakes in one command (`train_batch_size=0 rollout.n=0 lr=nan`)",
         "names all three at once", 2,
         message=(esc("data.train_batch_size"), esc("actor_rollout_ref.rollout.n"),
                  esc("actor_rollout_ref.actor.optim.lr")),
         argv=("data.train_batch_size=0", "actor_rollout_ref.rollout.n=0",
               "actor_rollout_ref.actor.optim.lr=nan"), fast=True),
    Case("config_string_for_int", "config", "`data.train_batch_size=sixteen`",
         "names the key, the value and the type it needs", 2,
         message=(esc("data.train_batch_size"), "sixteen"),
         argv=("data.train_batch_size=sixteen",), fast=True),
    Case("config_float_for_int", "config", "`actor_rollout_ref.rollout.n=2.5`",
         "names the key, the value and the type it needs", 2,
         message=(esc("actor_rollout_ref.rollout.n"), r"2\.5"),
         argv=("actor_rollout_ref.rollout.n=2.5",), fast=True),
    Case("config_string_for_bool", "config", "`trainer.val_before_train=maybe`",
         "names the key, the value and the type it needs", 2,
         message=(esc("trainer.val_before_train"), "maybe"),
         argv=("trainer.val_before_train=maybe",), fast=True),
    Case("config_unknown_key_typo", "config", "a typo: `trainer.totl_training_steps=5`",
         "names the unknown key and suggests `trainer.total_training_steps`", 2,
         message=(esc("trainer.totl_training_steps"), esc("trainer.total_training_steps")),
         argv=("trainer.totl_training_steps=5",), fast=True),
    Case("config_unknown_group", "config", "a key of no group: `optimizer.lr=1e-4`",
         "names the unknown key", 2, message=(esc("optimizer.lr"),),
         argv=("optimizer.lr=1e-4",), fast=True),
    Case("config_not_key_value", "config", "an argument without `=`: `trainer.save_freq`",
         "names the argument and says it is not key=value", 2,
         message=(esc("trainer.save_freq"), "key=value"), argv=("trainer.save_freq",),
         fast=True),
    Case("config_missing_preset", "config", "`--config` naming a file that does not exist",
         "names the file", 2, message=(r"nope\.yaml",),
         argv=("--config", "{tmp}/nope.yaml"), fast=True),
    Case("config_preset_bad_yaml", "config", "a preset that is not valid YAML",
         "names the file and the YAML error", 2, message=(r"broken\.yaml", "yaml"),
         argv=("--config", "{tmp}/broken.yaml"),
         files={"broken.yaml": "trainer:\n  save_freq: [1, 2\n  seed: :\n"}, fast=True),
    Case("config_preset_unknown_key", "config", "a preset with an unknown key",
         "names the key and the file", 2, message=(r"save_frequency", r"preset\.yaml"),
         argv=("--config", "{tmp}/preset.yaml"),
         files={"preset.yaml": "trainer:\n  save_frequency: 10\n"}, fast=True),
    bad_value("config_truncation_unknown", "`data.truncation=middle`", "data.truncation",
              "middle"),
    bad_value("config_resume_mode_unknown", "`trainer.resume_mode=sometimes`",
              "trainer.resume_mode", "sometimes"),
    bad_value("config_device_unknown", "`trainer.device=tpu`", "trainer.device", "tpu"),
    bad_value("config_adv_estimator_unknown", "`algorithm.adv_estimator=magic`",
              "algorithm.adv_estimator", "magic"),
    bad_value("config_loss_agg_unknown", "`actor.loss_agg_mode=average`",
              "actor_rollout_ref.actor.loss_agg_mode", "average"),
    Case("config_rollout_unknown", "config", "`actor_rollout_ref.rollout.name=turbo`",
         "names the plugin group, the name, what is installed and the pip install", 2,
         message=("siirl.rollouts", "turbo"), argv=("actor_rollout_ref.rollout.name=turbo",),
         fast=True),
    Case("config_engine_unknown", "config", "`actor_rollout_ref.actor.strategy=deepspeed`",
         "names the plugin group, the name and what is installed", 2,
         message=("siirl.engines", "deepspeed"),
         argv=("actor_rollout_ref.actor.strategy=deepspeed",), fast=True),
    Case("config_reward_manager_unknown", "config", "`reward_model.reward_manager=magic`",
         "names the plugin group, the name and what is installed", 2,
         message=("siirl.reward_managers", "magic"),
         argv=("reward_model.reward_manager=magic",), fast=True),
    Case("config_model_path_missing", "config",
         "`actor_rollout_ref.model.path=/models/missing` (no such folder)",
         "names the key and the path", 2,
         message=(esc("actor_rollout_ref.model.path"), esc("/models/missing")),
         argv=("actor_rollout_ref.model.path=/models/missing",), fast=True),
]


# ---------------------------------------------------------------------------------------
# bad data: the file, the row and the column; an empty dataset names file and filter
# ---------------------------------------------------------------------------------------

def row(i: int, **change) -> dict:
    a, b = i % 17, (i * 7) % 13
    base = {"data_source": "arithmetic", "prompt": [{"role": "user", "content": f"{a}+{b}="}],
            "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(a + b)},
            "extra_info": {"split": "train", "index": i}}
    for key, value in change.items():
        if value is DROP:
            base.pop(key, None)
        else:
            base[key] = value
    return base


DROP = object()
ROWS = 64


def jsonl(rows) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


def rows_with(bad_at: int, bad) -> str:
    """64 good rows with row ``bad_at`` replaced by ``bad`` (a dict, or a raw line)."""
    return jsonl(bad if i == bad_at else row(i) for i in range(ROWS))


def parquet(rows: list) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)

    return write


TRAIN = ("data.train_files={tmp}/train.jsonl",)
ROW_NAMED = "names the file, the row and the column"


def bad_row(cid: str, did: str, bad, column: str, row_no: int = 5) -> Case:
    return Case(cid, "data", did, ROW_NAMED, 2,
                message=(r"train\.jsonl", rf"row {row_no}\b", esc(column)), argv=TRAIN,
                files={"train.jsonl": rows_with(row_no, bad)})


DATA = [
    Case("data_malformed_json_line", "data", "a JSONL file with a broken line (row 5)",
         "names the file and the row", 2, message=(r"train\.jsonl", r"row 5\b"), argv=TRAIN,
         files={"train.jsonl": rows_with(5, '{"data_source": "arithmetic", "prompt": [')}),
    Case("data_not_utf8", "data", "a JSONL file with Latin-1 bytes in row 3",
         "names the file and the row (or byte offset) that is not UTF-8", 2,
         message=(r"train\.jsonl", r"utf-?8"), argv=TRAIN,
         files={"train.jsonl": rows_with(3, json.dumps(row(3)).replace(
             "arithmetic", "arithm\u00e9tique")).encode("latin-1")}),
    bad_row("data_missing_prompt", "a row without the `prompt` column",
            row(5, prompt=DROP), "prompt"),
    bad_row("data_prompt_is_string", "a row whose `prompt` is a string, not chat messages",
            row(5, prompt="13+5="), "prompt"),
    bad_row("data_message_without_role", "a chat message without `role`",
            row(5, prompt=[{"content": "13+5="}]), "role"),
    bad_row("data_missing_ground_truth", "a row without `reward_model.ground_truth`",
            row(5, reward_model={"style": "rule"}), "ground_truth"),
    bad_row("data_reward_model_is_int", "a row whose `reward_model` is a number",
            row(5, reward_model=7), "reward_model"),
    bad_row("data_source_not_string", "a row whose `data_source` is a number",
            row(5, data_source=123), "data_source"),
    Case("data_empty_file", "data", "an empty train file",
         "names the file and says it has no rows", 2,
         message=(r"train\.jsonl", r"empty|no rows|0 rows"), argv=TRAIN,
         files={"train.jsonl": ""}),
    Case("data_blank_lines_only", "data", "a train file of blank lines",
         "names the file and says it has no rows", 2,
         message=(r"train\.jsonl", r"empty|no rows|0 rows"), argv=TRAIN,
         files={"train.jsonl": "\n\n  \n"}),
    Case("data_all_filtered", "data",
         "every prompt longer than `data.max_prompt_length=2` with "
         "`data.filter_overlong_prompts=true`",
         "names the file and the filter that emptied it", 2,
         message=(r"train\.jsonl", r"filter_overlong_prompts|max_prompt_length"),
         argv=(*TRAIN, "data.filter_overlong_prompts=true", "data.max_prompt_length=2"),
         files={"train.jsonl": jsonl(row(i) for i in range(ROWS))}),
    Case("data_prompt_too_long", "data",
         "prompts longer than `data.max_prompt_length=2`, no filter",
         "names the file, the row and the limit", 2,
         message=(r"train\.jsonl", r"row 0\b", r"max_prompt_length"),
         argv=(*TRAIN, "data.max_prompt_length=2"),
         files={"train.jsonl": jsonl(row(i) for i in range(ROWS))}),
    Case("data_fewer_rows_than_batch", "data", "3 rows for a batch of 16 prompts",
         "names the file, its row count and the batch size", 2,
         message=(r"train\.jsonl", r"\b3\b", r"train_batch_size|16"), argv=TRAIN,
         files={"train.jsonl": jsonl(row(i) for i in range(3))}),
    Case("data_missing_file", "data", "`data.train_files` naming a file that does not exist",
         "names the path", 2, message=(r"missing\.parquet",),
         argv=("data.train_files={tmp}/missing.parquet",)),
    Case("data_directory", "data", "`data.train_files` naming a folder",
         "names the path", 2, message=(r"adir",),
         argv=("data.train_files={tmp}/adir",),
         files={"adir/README": "not a dataset\n"}),
    Case("data_parquet_wrong_schema", "data", "a parquet file with other columns",
         "names the file, the row and the missing column", 2,
         message=(r"train\.parquet", r"prompt"), argv=("data.train_files={tmp}/train.parquet",),
         files={"train.parquet": parquet([{"question": "1+1=", "answer": "2"}] * 32)}),
    Case("data_parquet_corrupt", "data", "a `.parquet` file that is not parquet",
         "names the file", 2, message=(r"train\.parquet", r"parquet"),
         argv=("data.train_files={tmp}/train.parquet",),
         files={"train.parquet": b"PAR1" + bytes(range(256)) * 8}),
    Case("data_unsupported_extension", "data", "a `.csv` train file",
         "names the file and the formats it reads", 2, message=(r"train\.csv", r"parquet"),
         argv=("data.train_files={tmp}/train.csv",), files={"train.csv": "a,b\n1,2\n"}),
    Case("data_prompt_key_absent", "data",
         "`data.prompt_key=question` on files with a `prompt` column",
         "names the file, the row and the `question` column", 2,
         message=(r"train\.jsonl", r"row 0\b", r"question"),
         argv=(*TRAIN, "data.prompt_key=question"),
         files={"train.jsonl": jsonl(row(i) for i in range(ROWS))}),
    Case("data_bad_val_file", "data", "a broken validation file (row 2)",
         "names the validation file and the row", 2, message=(r"val\.jsonl", r"row 2\b"),
         argv=(*TRAIN, "data.val_files={tmp}/val.jsonl"),
         files={"train.jsonl": jsonl(row(i) for i in range(ROWS)),
                "val.jsonl": rows_with(2, "not json at all")}),
    Case("data_unknown_data_source", "data",
         "rows of a `data_source` no built-in scorer knows, and no reward function",
         "names the data_source and how to give a reward function", 2,
         message=(r"my_task", r"custom_reward_function"), argv=TRAIN,
         files={"train.jsonl": jsonl(row(i, data_source="my_task") for i in range(ROWS))}),
]


# ---------------------------------------------------------------------------------------
# bad reward code: contained (the sample scores 0, counted in reward/errors) under every
# manager; a run where every sample fails stops after reward_model.max_failed_steps
# ---------------------------------------------------------------------------------------

ROW_FN = '''"""A user reward function with a bug (reliability corpus)."""
import ctypes, math, os, signal, sys, time

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


def _fault_now(extra_info, solution_str):
    {select}


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if _fault_now(extra_info, solution_str):
        {fault}
    return float(solution_str.strip().startswith(str(ground_truth)))
'''

BATCH_FN = '''"""A batch reward function with a bug (reliability corpus)."""
import ctypes, math, os, signal, sys, time

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


# ---------------------------------------------------------------------------------------
# bad checkpoints: the seeded run folder has committed checkpoints of steps 1 and 2
# ---------------------------------------------------------------------------------------

def truncate(rel: str, keep: float = 0.5) -> Callable[[Path], None]:
    def apply(run: Path) -> None:
        path = run / rel
        data = path.read_bytes()
        path.write_bytes(data[:int(len(data) * keep)])
    return apply


def flip(rel: str) -> Callable[[Path], None]:
    """Invert 256 bytes in the middle of the file (size unchanged)."""
    def apply(run: Path) -> None:
        path = run / rel
        data = bytearray(path.read_bytes())
        mid = len(data) // 2
        data[mid:mid + 256] = bytes(b ^ 0xFF for b in data[mid:mid + 256])
        path.write_bytes(bytes(data))
    return apply


def remove(rel: str) -> Callable[[Path], None]:
    def apply(run: Path) -> None:
        (run / rel).unlink()
    return apply


def write(rel: str, content: str) -> Callable[[Path], None]:
    def apply(run: Path) -> None:
        (run / rel).parent.mkdir(parents=True, exist_ok=True)
        (run / rel).write_text(content)
    return apply


def malicious_state(run: Path) -> None:
    """A trainer state whose unpickling would run code (it would create {tmp}/PWNED)."""
    import os
    import pickle

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {run.parent / 'PWNED'}",))

    (run / "global_step_2/trainer_state.pt").write_bytes(pickle.dumps(Payload()))


RESUME3 = ("trainer.total_training_steps=3",)
FALLBACK = ("resumes from the newest intact checkpoint (step 1) with a warning naming the "
            "damaged one and what was wrong")
RESUMED_OK = ("committed_intact", "steps_once")


def damaged_newest(cid: str, did: str, damage, what: str) -> Case:
    return Case(cid, "checkpoint", did, FALLBACK, 0, message=(r"global_step_2", what),
                argv=RESUME3, seed=True, damage=damage, damaged=("global_step_2",),
                checks=RESUMED_OK, whole_stderr=True)


RESUME_PATH = ("trainer.resume_mode=resume_path",
               "trainer.resume_from_path={run}/global_step_2")

CHECKPOINT = [
    damaged_newest("ckpt_truncated_model", "the newest checkpoint's model file is truncated",
                   truncate("global_step_2/actor/model.safetensors"), r"model\.safetensors"),
    damaged_newest("ckpt_corrupted_model",
                   "256 bytes of the newest checkpoint's model file are corrupted (same size)",
                   flip("global_step_2/actor/model.safetensors"), r"model\.safetensors"),
    damaged_newest("ckpt_truncated_optimizer",
                   "the newest checkpoint's optimizer file is truncated",
                   truncate("global_step_2/actor/optimizer.pt"), r"optimizer\.pt"),
    damaged_newest("ckpt_corrupted_trainer_state",
                   "the newest checkpoint's trainer state is corrupted (same size)",
                   flip("global_step_2/trainer_state.pt"), r"trainer_state"),
    damaged_newest("ckpt_missing_optimizer",
                   "`optimizer.pt` was deleted from the newest checkpoint",
                   remove("global_step_2/actor/optimizer.pt"), r"optimizer"),
    damaged_newest("ckpt_missing_trainer_state",
                   "`trainer_state.pt` (dataloader position, RNG) was deleted from the newest "
                   "checkpoint", remove("global_step_2/trainer_state.pt"), r"trainer_state"),
    damaged_newest("ckpt_missing_extra", "`actor/extra.pt` was deleted from the newest "
                   "checkpoint", remove("global_step_2/actor/extra.pt"), r"extra"),
    Case("ckpt_malicious_pickle", "checkpoint",
         "the newest checkpoint's trainer state was replaced by a pickle that runs code",
         FALLBACK + "; the pickle never runs", 0, message=(r"global_step_2", r"trainer_state"),
         argv=RESUME3, seed=True, damage=malicious_state, damaged=("global_step_2",),
         checks=(*RESUMED_OK, "no_code_ran"), whole_stderr=True),
    Case("ckpt_empty_newer", "checkpoint",
         "a folder `global_step_3` holding only `COMMITTED` (files lost)",
         "resumes from step 2 with a warning naming global_step_3", 0,
         message=(r"global_step_3",), argv=RESUME3, seed=True,
         damage=write("global_step_3/COMMITTED", '{"step": 3}'), damaged=("global_step_3",),
         checks=RESUMED_OK, whole_stderr=True),
    Case("ckpt_missing_committed", "checkpoint",
         "the newest checkpoint lacks `COMMITTED` (a crash mid-save)",
         "resumes from step 1, the newest committed one; each step logged once", 0,
         argv=RESUME3, seed=True, damage=remove("global_step_2/COMMITTED"),
         damaged=("global_step_2",), checks=RESUMED_OK),
    Case("ckpt_partial_leftover", "checkpoint",
         "a `.global_step_3.partial` folder left by a killed save",
         "resumes from step 2, saves step 3 and leaves no `.partial` folder", 0,
         argv=(*RESUME3, "trainer.save_freq=1"), seed=True,
         damage=write(".global_step_3.partial/actor/model.safetensors", "half a file"),
         checks=(*RESUMED_OK, "new_checkpoint")),
    Case("ckpt_latest_file_garbage", "checkpoint",
         "`latest_checkpointed_iteration.txt` holds `banana`",
         "resumes from the newest committed checkpoint (step 2)", 0, argv=RESUME3, seed=True,
         damage=write("latest_checkpointed_iteration.txt", "banana\n"), checks=RESUMED_OK),
    Case("ckpt_resume_path_missing", "checkpoint",
         "`trainer.resume_from_path` naming a folder that does not exist",
         "names the path and that it does not exist", 2,
         message=(r"global_step_9", r"resume_from_path|does not exist|no such|not found"),
         argv=(*RESUME3, "trainer.resume_mode=resume_path",
               "trainer.resume_from_path={run}/global_step_9"), seed=True,
         checks=("committed_intact",)),
    Case("ckpt_resume_path_truncated", "checkpoint",
         "`trainer.resume_from_path` names a checkpoint whose model file is truncated",
         "refuses it, naming the checkpoint and the file; loads nothing", (1, 2),
         message=(r"global_step_2", r"model\.safetensors"), argv=(*RESUME3, *RESUME_PATH),
         seed=True, damage=truncate("global_step_2/actor/model.safetensors"),
         damaged=("global_step_2",), checks=("committed_intact",)),
    Case("ckpt_resume_path_no_optimizer", "checkpoint",
         "`trainer.resume_from_path` names a checkpoint without `optimizer.pt`",
         "refuses it, naming the checkpoint and the missing optimizer state", (1, 2),
         message=(r"global_step_2", r"optimizer"), argv=(*RESUME3, *RESUME_PATH), seed=True,
         damage=remove("global_step_2/actor/optimizer.pt"), damaged=("global_step_2",),
         checks=("committed_intact",)),
    Case("ckpt_other_model", "checkpoint",
         "resuming with a model of another shape (1 layer instead of the checkpoint's 3)",
         "refuses the checkpoint, naming it and the mismatch; loads nothing", (1, 2),
         message=(r"global_step_2", r"shape|size|mismatch|match|unexpected|missing|layer"),
         argv=(*RESUME3, "+actor_rollout_ref.model.override_config.num_hidden_layers=1"),
         seed=True, checks=("committed_intact",)),
]


# ---------------------------------------------------------------------------------------
# disk faults
# ---------------------------------------------------------------------------------------

def chmod(rel: str, mode: int) -> Callable[[Path], None]:
    def apply(run: Path) -> None:
        path = run / rel
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(mode)
    return apply


def make_dir(rel: str) -> Callable[[Path], None]:
    def apply(run: Path) -> None:
        (run / rel).mkdir(parents=True, exist_ok=True)
    return apply


STORAGE = r"writ|permission|read-only|space|too large|not a directory|file exists"
DISK = [
    Case("disk_output_read_only", "disk", "`trainer.default_local_dir` is a read-only folder",
         "names the folder and that it cannot be written", (1, 2),
         message=(r"/run\b", STORAGE), damage=chmod(".", 0o555), unprivileged=True),
    Case("disk_output_is_file", "disk", "`trainer.default_local_dir` is a file",
         "names the path and that it is not a folder", (1, 2),
         message=(r"/run\b", r"director|folder|not a dir|exists"),
         argv=("trainer.default_local_dir={tmp}/run.txt",), files={"run.txt": "a file\n"}),
    Case("disk_output_under_file", "disk", "`trainer.default_local_dir` lies under a file",
         "names the path and that it is not a folder", (1, 2),
         message=(r"afile", r"director|folder|not a dir"),
         argv=("trainer.default_local_dir={tmp}/afile/run",), files={"afile": "a file\n"}),
    Case("disk_read_only_before_save", "disk",
         "the output folder turns read-only between runs; the resumed run saves every step",
         "says the checkpoint cannot be written: keeps training and says so, or stops; "
         "committed checkpoints intact", (0, 1), message=(r"checkpoint|global_step", STORAGE),
         argv=("trainer.total_training_steps=4", "trainer.save_freq=1"), seed=True,
         damage=chmod(".", 0o555), unprivileged=True, whole_stderr=True,
         checks=("committed_intact",)),
    Case("disk_file_size_limit", "disk",
         "a file-size limit (`ulimit -f`, 1.2 MB) that the optimizer state exceeds",
         "says the checkpoint cannot be written: keeps training and says so, or stops; no "
         "`.partial` left", (0, 1), message=(r"checkpoint|global_step", STORAGE),
         argv=("trainer.total_training_steps=2", "trainer.save_freq=1"),
         file_size_limit=1_200_000, whole_stderr=True),
    Case("disk_metrics_is_directory", "disk", "`metrics.jsonl` in the output folder is a folder",
         "names metrics.jsonl and that it cannot be written", (1, 2),
         message=(r"metrics\.jsonl",), damage=make_dir("metrics.jsonl")),
]


# ---------------------------------------------------------------------------------------
# signals and worker faults
# ---------------------------------------------------------------------------------------

TERMINATED = (r"^siirl-train: terminated",)
INTERRUPTED = (r"^siirl-train: interrupted",)
KEEPS = ("committed_intact",)
PARALLEL = ("reward_model.reward_manager=parallel",)

SIGNAL = [
    Case("signal_sigterm", "signal", "SIGTERM (e.g. a scheduler) during training",
         "one line; the last committed checkpoint is kept", 143,
         message=TERMINATED, argv=LONG, fault=Fault("sigterm"), checks=KEEPS),
    Case("signal_ctrl_c", "signal", "Ctrl-C during training",
         "one line; the last committed checkpoint is kept", 130,
         message=INTERRUPTED, argv=LONG, fault=Fault("sigint"), checks=KEEPS),
    Case("signal_ctrl_c_twice", "signal", "Ctrl-C twice, impatiently",
         "one line; the last committed checkpoint is kept", 130,
         message=INTERRUPTED, argv=LONG, fault=Fault("sigint_twice"), checks=KEEPS),
    Case("signal_ctrl_c_parallel", "signal",
         "Ctrl-C during training with the `parallel` reward manager",
         "one line, none from the pool processes", 130, message=INTERRUPTED,
         argv=(*LONG, *PARALLEL), fault=Fault("sigint"), checks=KEEPS),
    Case("signal_sigterm_parallel", "signal", "SIGTERM with the `parallel` reward manager",
         "one line, none from the pool processes", 143, message=TERMINATED,
         argv=(*LONG, *PARALLEL), fault=Fault("sigterm"), checks=KEEPS),
    Case("signal_sigterm_at_start", "signal", "SIGTERM 1.5 s after the start, before step 1",
         "one line", 143, message=TERMINATED, argv=LONG,
         fault=Fault("sigterm", after_s=1.5)),
    Case("signal_sigterm_while_saving", "signal",
         "SIGTERM while a checkpoint is saved at every step",
         "one line; the in-flight checkpoint is committed or discarded, "
         "never half-written", 143, message=TERMINATED,
         argv=("trainer.total_training_steps=500", "trainer.save_freq=1"),
         fault=Fault("sigterm", after_steps=4), checks=KEEPS),
    Case("signal_kill_9_then_resume", "signal", "`kill -9` of the run, then the same command",
         "the next run resumes from the last committed checkpoint; each step logged once", -9,
         argv=LONG, fault=Fault("sigkill"), then=("trainer.total_training_steps=12",),
         checks=("committed_intact", "steps_once"), timeout_s=300),
]

WORKER_ARGS = (*LONG, "trainer.test_freq=-1")
WORKER = [
    Case("worker_stopped", "worker", "a worker of a 2-worker run is stopped (SIGSTOP)",
         "names the worker's rank, pid and host, and the heartbeat timeout", 1,
         message=(r"worker rank 1 \(pid \d+ on", r"stopped responding",
                  r"heartbeat_timeout_s=6"),
         argv=(*WORKER_ARGS, "trainer.heartbeat_timeout_s=6"), workers=2,
         fault=Fault("stop_worker"), checks=KEEPS, timeout_s=300),
    Case("worker_killed_then_resume", "worker",
         "a worker of a 2-worker run is killed (SIGKILL), then the same command",
         "names the worker's rank and pid; the next run resumes, each step once", 1,
         message=(r"rank 1", r"pid \d+"), argv=WORKER_ARGS, workers=2,
         fault=Fault("kill_worker"), then=("trainer.total_training_steps=12",),
         checks=("committed_intact", "steps_once"), timeout_s=300),
    Case("worker_sigterm", "worker", "SIGTERM to a 2-worker run",
         "one line; every worker stops within seconds", 143, message=TERMINATED,
         argv=WORKER_ARGS, workers=2, fault=Fault("sigterm"), checks=KEEPS, timeout_s=300),
    Case("worker_ctrl_c", "worker", "Ctrl-C in a 2-worker run",
         "one line; every worker stops within seconds", 130,
         message=INTERRUPTED, argv=WORKER_ARGS, workers=2, fault=Fault("sigint"),
         checks=KEEPS, timeout_s=300),
]

CASES = [*CONFIG, *DATA, *REWARD, *CHECKPOINT, *DISK, *SIGNAL, *WORKER]


def _check_corpus() -> None:
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)), "duplicate case ids"
    assert all(c.kind in CLASSES for c in CASES)


_check_corpus()
