"""siirl.user_file: a user's .py file imported as a module, and the errors that name the
config key, the file and the object wanted."""

from __future__ import annotations

import sys

import pytest

from siirl.errors import ConfigError, PipelineError
from siirl.user_file import UserFile, defined_names, import_file, load_from_file

WHERE = UserFile(key="custom_reward_function.path", prefix="siirl_test_user_file_",
                 kind="function", name_key="custom_reward_function.name", hint="See the docs.")


def _write(tmp_path, text, name="user.py"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_file_loads_once_into_sys_modules_under_a_name_from_its_path(tmp_path):
    path = _write(tmp_path, "import json\nCALLS = []\ndef score():\n    return 1\n"
                            "class Helper:\n    pass\n")
    fn = load_from_file(str(path), "score", WHERE)
    module = import_file(f"file://{path}", "score", WHERE)
    assert fn() == 1 and module.score is fn  # the file:// form is the same file, same module
    assert sys.modules[module.__name__] is module
    assert module.__name__.startswith(WHERE.prefix)
    assert defined_names(module) == ["Helper", "score"]  # json is imported, not defined


def test_a_missing_file_names_the_key_the_path_and_what_it_should_define(tmp_path):
    missing = tmp_path / "nowhere.py"
    with pytest.raises(ConfigError) as info:
        load_from_file(str(missing), "score", WHERE)
    message = str(info.value)
    assert f"custom_reward_function.path='{missing}' is not a file" in message
    assert "function 'score' (custom_reward_function.name)" in message


def test_a_file_that_raises_or_exits_while_importing_is_the_users_error(tmp_path):
    raising = _write(tmp_path, "raise ValueError('broken on purpose')\n", "raising.py")
    with pytest.raises(ConfigError, match=r"raising.py' failed to import while looking for "
                                          r"the function 'score'.*ValueError: broken on "
                                          r"purpose\. See the docs\."):
        load_from_file(str(raising), "score", WHERE)
    assert not [name for name, module in sys.modules.items()
                if getattr(module, "__file__", None) == str(raising)]  # not left half-loaded
    exiting = _write(tmp_path, "import sys\nsys.exit(3)\n", "exiting.py")
    with pytest.raises(ConfigError, match="failed to import.*SystemExit: 3"):
        load_from_file(str(exiting), "score", WHERE)


def test_a_missing_attribute_lists_what_the_file_defines(tmp_path):
    path = _write(tmp_path, "def other():\n    pass\nclass Thing:\n    pass\n")
    with pytest.raises(ConfigError) as info:
        load_from_file(str(path), "score", WHERE)
    message = str(info.value)
    assert f"custom_reward_function.path='{path}' defines no function 'score'" in message
    assert "it defines Thing, other. See the docs." in message
    empty = _write(tmp_path, "X = 1\n", "empty.py")
    with pytest.raises(ConfigError, match="defines no function 'score'.*no public function"):
        load_from_file(str(empty), "score", WHERE)


def test_the_caller_chooses_the_error_type(tmp_path):
    where = UserFile(key="node 'a' agent_options.process_path", prefix="siirl_test_agent_",
                     kind="function", error=PipelineError)
    with pytest.raises(PipelineError, match="node 'a' agent_options.process_path='nope.py' "
                                            "is not a file"):
        load_from_file("nope.py", "pre_process", where)


def test_a_module_name_held_by_another_module_is_refused_naming_its_key(tmp_path):
    path = _write(tmp_path, "def score():\n    return 1\n")
    with pytest.raises(ConfigError, match="reward_manager.module.name='json' is already the "
                                          "name of another module"):
        import_file(str(path), "score", WHERE, module_name="json",
                    module_name_key="reward_manager.module.name")
