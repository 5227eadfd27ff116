"""A package outside siiRL registers an environment through the ``siirl.environments``
entry point (an installed distribution's entry_points.txt, as pip writes it), and a short
AGENTIC run trains on it."""

import json
import os
import subprocess
import sys
import textwrap

MODULE = textwrap.dedent('''
    from siirl.environment import TextEnv

    class CoinFlip(TextEnv):
        instructions = "Say heads or tails in <answer></answer>."

        def __init__(self, bias: float = 0.5):
            self.bias = bias

        def reset(self, seed=None):
            self.side = "heads" if (seed or 0) % 2 else "tails"
            return "flip"

        def step(self, action):
            won = action.strip().lower() == self.side
            return "done", float(won), True, {"success": won}
''')


def install_plugin(root):
    """What `pip install` leaves on sys.path: the module and its dist-info."""
    (root / "coin_env.py").write_text(MODULE)
    info = root / "coin_env-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: coin-env\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[siirl.environments]\ncoin_flip = coin_env:CoinFlip\n")


def test_a_registered_third_party_environment_trains(tmp_path):
    plugin = tmp_path / "site"
    plugin.mkdir()
    install_plugin(plugin)
    run_dir = tmp_path / "run"
    env = dict(os.environ, RAY_AUTH_MODE="disabled",
               PYTHONPATH=os.pathsep.join(p for p in (str(plugin),
                                                      os.environ.get("PYTHONPATH")) if p))
    cmd = [sys.executable, "-m", "siirl.main_dag", "algorithm.workflow_type=AGENTIC",
           "+custom_envs.Coin.env_type=coin_flip", "+custom_envs.Coin.env_config.bias=0.7",
           "data.max_response_length=8", "data.train_batch_size=4",
           "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
           "trainer.total_training_steps=1", f"trainer.default_local_dir={run_dir}",
           "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1",
           "trainer.logger=[]", "trainer.device=cpu"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert "env/Coin/success_rate" in record and record["env/turns/mean"] >= 1
    # a misspelt name lists what is registered, the plugin's included
    cmd[4] = "+custom_envs.Coin.env_type=coin_flop"
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "coin_flop" in proc.stderr and "coin_flip" in proc.stderr, proc.stderr[-2000:]
