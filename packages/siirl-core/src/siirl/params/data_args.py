"""Schema of the ``data`` group: siirl-data's settings, mounted at ``data`` by ``root_args``.

The dataclasses live in ``siirl.data_coordinator.settings``, with the partitioned dataset
that reads them: siirl-data cannot import core, so core imports its section (as it depends on
siirl-data) rather than the section being defined twice. Their rules (refused keys, notices)
stay in ``siirl.params.key_rules``.
"""

from siirl.data_coordinator.settings import CustomClsArguments, DataArguments, SamplerArguments

__all__ = ["CustomClsArguments", "DataArguments", "SamplerArguments"]
