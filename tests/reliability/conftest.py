"""The corpus's slow cases (everything that loads a model) are skipped by default.

They run with ``SIIRL_RELIABILITY=all`` (what ``nox -s reliability`` sets) or when the
marker is selected: ``pytest tests/reliability -m reliability_slow``.
"""

import os

import pytest


def pytest_collection_modifyitems(config, items):
    wanted = os.environ.get("SIIRL_RELIABILITY", "") == "all" or \
        "reliability_slow" in (config.getoption("markexpr") or "")
    if wanted:
        return
    skip = pytest.mark.skip(reason="slow reliability case: nox -s reliability "
                                   "(or SIIRL_RELIABILITY=all)")
    for item in items:
        if "reliability_slow" in item.keywords:
            item.add_marker(skip)
