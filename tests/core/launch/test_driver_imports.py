"""The driver of a multi-worker job plans and starts Ray workers without importing torch:
those imports (seconds) belong to the workers, which do them in parallel. Planning asks the
actor engine plugin its on-policy question (siirl.engine.fsdp_workers, a light module)."""

import json
import subprocess
import sys

# siirl.engine itself is light and is imported on purpose: the config sections of the
# backends live in it (siirl.config plugins).
HEAVY = ("torch", "tensordict", "transformers", "pyarrow")


def test_planning_a_two_worker_job_imports_no_heavy_library():
    code = f"""
import json, pickle, sys
from siirl.launch.config import load_config
from siirl.launch.job import run
import siirl.launch.ray_launcher as launcher
import siirl.launch.worker_process  # what launch_ray imports
config = load_config(["trainer.device=cpu", "trainer.n_gpus_per_node=2"])
plans = []
launcher.launch_ray = lambda config, plan: plans.append(plan)  # stop before Ray starts
run(config)
pickle.dumps(plans[0])  # what the workers are sent
left_out = sorted(plans[0][0].graph.left_out)  # the actor engine plugin's answer, asked here
print(json.dumps([len(plans[0]), left_out, [m for m in {HEAVY!r} if m in sys.modules]]))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    workers, left_out, heavy = json.loads(proc.stdout.splitlines()[-1])
    assert workers == 2 and heavy == []
    # the main job's update is on-policy: the planner asked the fsdp plugin, torch-free
    assert "actor_old_log_prob" in left_out
