"""Library warnings the user cannot act on go to warnings.log; the user's own are shown."""

import io
import os
import sys
import warnings

from siirl.dag_worker.quiet_libraries import QuietLibraries, library_of

SITE = "/venv/lib/python3.11/site-packages"


def test_library_of_an_installed_file():
    assert library_of(f"{SITE}/megatron/core/optimizer/__init__.py") == "megatron"
    assert library_of(f"{SITE}/torch/distributed/c10d_logger.py") == "torch"
    assert library_of("/usr/lib/python3/dist-packages/transformers/x.py") == "transformers"
    assert library_of(f"{SITE}/siirl/dag_worker/x.py") is None  # siiRL's own
    assert library_of("/home/me/project/torch/train.py") is None  # the user's code
    assert library_of("<string>") is None


def test_library_warnings_go_to_the_log_others_are_shown(tmp_path):
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        with QuietLibraries(str(tmp_path), rank=1, world_size=2) as quiet:
            warnings.warn_explicit("Apex is not installed", UserWarning,
                                   f"{SITE}/megatron/core/models/backends.py", 21)
            warnings.warn_explicit("`all_gather_into_tensor` is deprecated", FutureWarning,
                                   f"{SITE}/torch/distributed/c10d_logger.py", 83)
            warnings.warn_explicit("check your reward", UserWarning, "/home/me/reward.py", 5)
        warnings.warn_explicit("after the run", UserWarning, f"{SITE}/torch/x.py", 1)
    assert [str(w.message) for w in shown] == ["check your reward", "after the run"]
    assert quiet.count == 2 and quiet.libraries == ["megatron", "torch"]
    log = (tmp_path / "warnings.log").read_text()
    assert log.startswith("[rank 1] ") and "Apex is not installed" in log
    assert "FutureWarning: `all_gather_into_tensor` is deprecated" in log
    stream = io.StringIO()
    quiet.announce(stream)
    quiet.announce(stream)  # once
    assert stream.getvalue() == (
        f"note: 2 library warning(s) (megatron, torch) that need no action are in "
        f"{tmp_path / 'warnings.log'} (with the other workers')\n")


def test_nothing_filtered_nothing_announced(tmp_path):
    with QuietLibraries(str(tmp_path)) as quiet:
        pass
    stream = io.StringIO()
    quiet.announce(stream)
    assert stream.getvalue() == "" and not (tmp_path / "warnings.log").exists()


def test_hugging_face_bars_off_while_stderr_is_not_a_terminal(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    transformers = sys.modules.get("transformers")  # switched off too when loaded
    with QuietLibraries(str(tmp_path)):
        assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
        if transformers is not None:
            assert not transformers.utils.logging.is_progress_bar_enabled()
    assert "HF_HUB_DISABLE_PROGRESS_BARS" not in os.environ
