"""The built-in models ``model.path`` may name (``builtin:...``), each with the folder under
``siirl/engine/assets/`` it ships in (``siirl.engine.models.loader`` loads them).

Torch-free: the fsdp backend's config section lists these names as its
``"builtin_models"`` table (``siirl.params.sections.ConfigSection.names``), which is where
``siirl-train --help`` reads them from; a model added here shows there with no other edit.
"""

BUILTIN_TINY_ARITH = "builtin:tiny-arith"
BUILTIN_TINY_ARITH_HD32 = "builtin:tiny-arith-hd32"
BUILTIN_TINY_AGENT = "builtin:tiny-agent"
BUILTIN_TINY_VLA = "builtin:tiny-vla"
BUILTIN_TINY_MOE = "builtin:tiny-moe"
BUILTIN_TINY_REPEAT = "builtin:tiny-repeat"
BUILTIN_ASSETS = {BUILTIN_TINY_ARITH: "tiny_arith", BUILTIN_TINY_ARITH_HD32: "tiny_arith_hd32",
                  BUILTIN_TINY_AGENT: "tiny_agent", BUILTIN_TINY_VLA: "tiny_vla",
                  BUILTIN_TINY_MOE: "tiny_moe", BUILTIN_TINY_REPEAT: "tiny_repeat"}
