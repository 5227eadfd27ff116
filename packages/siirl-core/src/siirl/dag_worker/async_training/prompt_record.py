"""``<trainer.default_local_dir>/async_prompts.jsonl``: the prompts (sample ids) each step
of an asynchronous run trained, one line per step. A resumed run keeps the lines up to
its checkpoint's step and writes the later ones again, like ``metrics.jsonl``; so the
file says which prompts the run trained, each once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

FILE = "async_prompts.jsonl"


class PromptRecord:
    def __init__(self, run_dir: str, keep_through: int, chief: bool):
        self._file: Optional[object] = None
        if not chief:
            return
        path = Path(run_dir) / FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        kept = []
        if keep_through >= 0 and path.exists():
            kept = [line for line in path.read_text().splitlines()
                    if line.strip() and json.loads(line)["step"] <= keep_through]
        path.write_text("".join(line + "\n" for line in kept))
        self._file = path.open("a")

    def write(self, step: int, prompts: List[int]) -> None:
        if self._file is not None:
            self._file.write(json.dumps({"step": step, "prompts": sorted(prompts)}) + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
