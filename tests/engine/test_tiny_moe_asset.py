"""The built-in tiny mixture of experts (``builtin:tiny-moe``, made by tools/make_tiny_moe.py)
loads offline, is a 4-expert top-2 Mixtral with tiny-arith's tokenizer, and is what the
script builds: a re-run reproduces the shipped weights exactly."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[2]
ASSETS = REPO / "packages" / "siirl-engine" / "src" / "siirl" / "engine" / "assets"
ASSET = ASSETS / "tiny_moe"


def _make_tiny_moe():
    import sys

    sys.path.insert(0, str(REPO / "tools"))
    try:
        spec = importlib.util.spec_from_file_location("make_tiny_moe",
                                                      REPO / "tools" / "make_tiny_moe.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(REPO / "tools"))


@pytest.fixture(scope="module")
def model():
    from siirl.engine.models import loader

    kind, where, gguf = loader.resolve_model_path("builtin:tiny-moe")
    assert (kind, Path(where), gguf) == ("dir", loader.tiny_moe_dir(), None)
    return transformers.AutoModelForCausalLM.from_pretrained(where, local_files_only=True).eval()


def test_is_a_small_four_expert_top_two_mixtral(model):
    cfg = model.config
    assert cfg.model_type == "mixtral"
    assert (cfg.num_local_experts, cfg.num_experts_per_tok) == (4, 2)
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size) == (64, 3, 58)
    assert sum(p.stat().st_size for p in ASSET.iterdir()) < 3 * 1024 * 1024


def test_shares_tiny_arith_tokenizer():
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (ASSET / name).read_bytes() == (ASSETS / "tiny_arith" / name).read_bytes(), name


def test_the_script_rebuilds_the_shipped_weights(tmp_path, model):
    """Deterministic (seeded, one thread): the card's command gives the same tensors, and
    its accuracy line is the model's."""
    _make_tiny_moe().main(["--out", str(tmp_path)])
    rebuilt = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, local_files_only=True)
    shipped = model.state_dict()
    for name, tensor in rebuilt.state_dict().items():
        assert torch.equal(tensor, shipped[name]), name
    card = (ASSET / "README.md").read_text()
    assert card.startswith("# tiny_moe\n") and "python tools/make_tiny_moe.py" in card
    assert "builtin:tiny-moe" in card
    ours = re.search(r"\(this model\) \| ([0-9.]+) \|", card).group(1)
    assert ours in (tmp_path / "README.md").read_text()
    assert float(ours) > 0.2, "the upcycled model must solve some of the task's problems"
