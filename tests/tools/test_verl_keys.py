"""tools/verl_keys.py: the table of verl's keys in docs/configuration.md is current, and
its comparison of defaults leaves computed ones alone."""

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("verl_keys", ROOT / "tools/verl_keys.py")
verl_keys = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(verl_keys)


def test_the_docs_table_is_current():
    proc = subprocess.run([sys.executable, str(ROOT / "tools/verl_keys.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_defaults_compare_plain_values_only():
    assert verl_keys._differs(8, 1) and verl_keys._differs("hf", "vllm")
    assert not verl_keys._differs(1, 1.0) and not verl_keys._differs(None, None)
    assert not verl_keys._differs("${data.max_response_length}", 512)
    assert verl_keys._differs(True, 1)  # a flag is not a count


def test_flatten_keeps_leaves_and_drops_private_keys():
    assert verl_keys.flatten({"a": {"b": 1, "_target_": "x", "c": {}}, "d": [1]}) == {
        "a.b": 1, "a.c": {}, "d": [1]}
