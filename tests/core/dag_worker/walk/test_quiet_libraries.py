"""Library warnings the user cannot act on go to warnings.log; the user's own are shown."""

import io
import os
import sys
import warnings

from siirl.dag_worker.walk.quiet_libraries import QuietLibraries, library_of

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


def test_a_deprecation_a_library_logs_goes_to_the_log(tmp_path):
    """transformers logs some deprecations (``logger.warning_once``) instead of warning."""
    import logging

    import transformers.utils.logging as hf_logging

    hf_logging.get_logger("transformers.utils.generic")  # transformers' own handler
    library = logging.getLogger("transformers.utils.generic")
    own = logging.getLogger("siirl.something")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    for logger in (logging.getLogger("transformers"), logging.getLogger()):
        logger.addHandler(handler)
    try:
        with QuietLibraries(str(tmp_path)) as quiet:
            library.warning("`past_key_values`/`cache_params` are deprecated. Use `cache`")
            library.warning("Some weights were not initialized")  # may need action: shown
            library.error("the model's config is deprecated and broken")  # errors: shown
            own.warning("siiRL's own deprecation notice is shown")
        library.warning("after the run: `foo` is deprecated")
    finally:
        for logger in (logging.getLogger("transformers"), logging.getLogger()):
            logger.removeHandler(handler)
    shown = stream.getvalue()
    assert "past_key_values" not in shown
    assert "Some weights were not initialized" in shown and "broken" in shown
    assert "siiRL's own deprecation" in shown and "after the run" in shown
    assert quiet.count == 1 and quiet.libraries == ["transformers"]
    assert (tmp_path / "warnings.log").read_text() == (
        "WARNING transformers.utils.generic: `past_key_values`/`cache_params` are "
        "deprecated. Use `cache`\n")
