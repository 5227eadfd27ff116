"""The reliability corpus's bad checkpoints (``cases.py`` lists every case)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from corpus_model import Case

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
