"""The run's configuration is typed once (``siirl.params.typed.to_typed``): what the
launcher hands workers, nodes, engines and environments is ``SiiRLArguments``, read by
attribute; no package reads a dotted key out of a config object any more."""

import dataclasses
import pickle
import re
from pathlib import Path

from siirl.params import SiiRLArguments
from siirl.params.parser import parse_config
from siirl.params.typed import to_typed

PACKAGES = Path(__file__).resolve().parents[3] / "packages"
DOTTED_READS = re.compile(r"config_select|OmegaConf\.select\(")


def test_a_parsed_config_becomes_the_schema_dataclasses_with_its_values():
    cfg = parse_config(["trainer.seed=7", "+custom_envs.Lake.env_type=frozen_lake",
                        "actor_rollout_ref.rollout.n=3"], check_support=False)
    typed = to_typed(cfg)
    assert isinstance(typed, SiiRLArguments)
    assert (typed.trainer.seed, typed.actor_rollout_ref.rollout.n) == (7, 3)
    assert typed.custom_envs == {"Lake": {"env_type": "frozen_lake"}}
    assert type(typed.custom_envs) is dict  # free-form groups stay plain dicts
    # interpolations are resolved: the rollout's budget is the data's
    assert typed.actor_rollout_ref.rollout.response_length == typed.data.max_response_length
    assert to_typed(typed) is typed  # typed once: a second call is the same object
    assert pickle.loads(pickle.dumps(typed)) == typed  # as a Ray actor receives it


def test_a_partial_dict_takes_the_schema_defaults():
    typed = to_typed({"algorithm": {"adv_estimator": "gae"}})
    assert typed.algorithm.adv_estimator == "gae"
    assert typed.algorithm.kl_ctrl == SiiRLArguments().algorithm.kl_ctrl
    assert dataclasses.asdict(to_typed(None)) == dataclasses.asdict(to_typed({}))


def test_no_package_reads_dotted_keys_out_of_a_config():
    readers = []
    for path in sorted(PACKAGES.glob("*/src/**/*.py")):
        relative = path.relative_to(PACKAGES).as_posix()
        if DOTTED_READS.search(path.read_text()):
            readers.append(relative)
    assert not readers, f"read the typed config's attributes instead: {readers}"
