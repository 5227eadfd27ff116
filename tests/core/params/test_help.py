"""siirl-train --help: every group's line is the schema's own text (never a builtin's
docstring), free-form dicts such as custom_envs have their own help, and a multi-line
docstring is shown whole, not cut mid-sentence."""

from siirl.launch.cli import main
from siirl.params.help import format_help


def test_top_level_lines_are_the_schema_text(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert "dict()" not in out and "new empty dictionary" not in out
    assert "AGENTIC environments by tag" in lines["custom_envs"]
    # the first paragraph of a two-line docstring, whole
    assert lines["train_env_manager"].rstrip().endswith("keeps in flight.")


def test_help_on_a_free_form_dict_describes_its_entries(capsys):
    assert main(["--help", "custom_envs"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("custom_envs: AGENTIC environments by tag")
    for key in ("env_type", "env_config", "env_instruction"):
        assert f"    {key} " in out
    assert "+custom_envs.Sok.env_type=sokoban" in out


def test_a_plain_key_is_still_not_a_group(capsys):
    assert main(["--help", "trainer.logger"]) == 2
    assert "'trainer.logger' is a key, not a group" in capsys.readouterr().err
    assert format_help("env_manager").startswith("env_manager: How episodes become")
