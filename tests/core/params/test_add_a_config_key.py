"""The steps of "Add a config key" in docs/architecture.md, for a key of a section a package
owns: the field with its default and help is all it takes for the key to be set on the
command line, printed by --print-config and --help, typed (a wrong value is named) and read
as an attribute of the typed configuration. The package is a plugin folder on PYTHONPATH,
as pip would install it, so nothing in siirl-core is edited."""

import os
import subprocess
import sys
import textwrap

import pytest

SECTION = textwrap.dedent('''
    from dataclasses import dataclass, field

    from siirl.params.sections import ConfigSection, Mount


    @dataclass
    class DemoArguments:
        """The demo package's settings."""

        rounds: int = field(default=4, metadata={"help": "How many demo rounds to run."})


    SECTION = ConfigSection(schema=DemoArguments, mounts=(Mount("algorithm.demo", "algorithm"),),
                            applies_to=(), label="demo")
''')


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    site = tmp_path_factory.mktemp("site")
    (site / "demo_keys").mkdir()
    (site / "demo_keys" / "__init__.py").write_text("")
    (site / "demo_keys" / "config.py").write_text(SECTION)
    info = site / "demo_keys-0.0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: demo-keys\nVersion: 0.0.0\n")
    (info / "entry_points.txt").write_text("[siirl.config]\ndemo = demo_keys.config:SECTION\n")
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYTHONPATH=path)


def _train(env, *args):
    return subprocess.run([sys.executable, "-m", "siirl.main_dag", *args], env=env,
                          capture_output=True, text=True, timeout=300)


def test_a_new_key_is_set_printed_and_described(env):
    default = _train(env, "--print-config")
    assert default.returncode == 0, default.stderr
    assert "  demo:\n    rounds: 4\n" in default.stdout
    assert "  demo:\n    rounds: 7\n" in _train(env, "--print-config",
                                                "algorithm.demo.rounds=7").stdout
    described = _train(env, "--help", "algorithm.demo")
    assert "How many demo rounds to run." in described.stdout


def test_a_wrong_value_or_a_misspelt_key_is_named(env):
    bad = _train(env, "--print-config", "algorithm.demo.rounds=many", "algorithm.demo.rouns=2")
    assert bad.returncode == 2
    assert "bad value for 'algorithm.demo.rounds'" in bad.stderr
    assert "unknown config key 'algorithm.demo.rouns'" in bad.stderr
    assert "(did you mean algorithm.demo.rounds?)" in bad.stderr


def test_the_code_reads_it_as_an_attribute_of_the_typed_configuration(env):
    script = ("from omegaconf import OmegaConf\n"
              "from siirl.params.parser import parse_config\n"
              "args = OmegaConf.to_object(parse_config(['algorithm.demo.rounds=9']))\n"
              "print(type(args).__name__, args.algorithm.demo.rounds)\n")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=300, check=True).stdout
    assert out.split() == ["SiiRLArguments", "9"]
