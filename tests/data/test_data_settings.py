"""The ``data`` section is typed once, in siirl-data (``siirl.data_coordinator.settings``):
core's schema mounts that class at ``data``, and siirl-data's code reads attributes of it,
never a key with a default of its own (``getattr(config, name, default)``,
``config.get(name, default)``) nor through a select."""

import ast
import dataclasses
from pathlib import Path

from siirl.data_coordinator import settings
from siirl.data_coordinator.dataloader import PartitionedDataset
from siirl.data_coordinator.settings import DataArguments

DATA_SRC = Path(__file__).resolve().parents[2] / "packages" / "siirl-data" / "src"
CONFIG_NAMED = ("config", "cfg", "settings", "args")


def _config_named(node: ast.AST) -> bool:
    return any(word in ast.unparse(node).lower() for word in CONFIG_NAMED)


def default_reads(source: str) -> list:
    """The places in ``source`` that read a setting with a default of their own or through a
    select: ``getattr(<config>, name, default)``, ``<config>.get(...)``, any ``select(...)``,
    and imports of omegaconf or core's config modules."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if name == "getattr" and len(node.args) == 3 and _config_named(node.args[0]):
                found.append(ast.unparse(node))
            elif isinstance(func, ast.Attribute) and name == "get" and \
                    _config_named(func.value):
                found.append(ast.unparse(node))
            elif name == "select":
                found.append(ast.unparse(node))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [alias.name for alias in node.names]
            found += [f"import {m}" for m in modules
                      if m.startswith(("omegaconf", "siirl.params", "siirl.execution"))]
    return found


def test_the_scan_finds_the_reads_it_forbids():
    # the reader this section replaced, and the other ways to copy a default
    old = '''
def _get(cfg, key, default=None):
    if isinstance(cfg, dict) or (hasattr(cfg, "get") and hasattr(cfg, "keys")):
        value = cfg.get(key, default)
    else:
        value = getattr(cfg, key, default)
    return default if value is None else value
prompt_key = getattr(self.data_config, "prompt_key", "prompt")
limit = OmegaConf.select(config, "data.max_prompt_length", default=512)
from siirl.execution.config_select import select
'''
    assert len(default_reads(old)) == 5
    assert default_reads("n = getattr(self.dataset, 'num_rows_total', 0)\n"
                         "rows = batch.get(key)\nlimit = data_config.max_prompt_length\n") == []


def test_siirl_data_reads_its_settings_as_attributes_only():
    readers = {}
    for path in sorted(DATA_SRC.rglob("*.py")):
        found = default_reads(path.read_text())
        if found:
            readers[path.relative_to(DATA_SRC).as_posix()] = found
    assert readers == {}, "read the attributes of the typed data section (DataArguments)"


def test_the_dataset_reads_only_fields_of_the_section():
    source = Path(PartitionedDataset.__module__.replace(".", "/") + ".py")
    tree = ast.parse((DATA_SRC / source).read_text())
    read = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name) and node.value.id == "data_config"}
    fields = {f.name for f in dataclasses.fields(DataArguments)}
    assert read and read <= fields, read - fields


def test_core_mounts_siirl_data_s_section_at_data():
    from siirl.params import DataArguments as core_data
    from siirl.params import SiiRLArguments

    assert core_data is settings.DataArguments
    assert isinstance(SiiRLArguments().data, settings.DataArguments)
