"""The SGLang server of the ``sglang`` rollout: one ``python -m sglang.launch_server``
process per worker, driven over SGLang's native HTTP API (process, health wait, restart
after a crash and weight files are ``server_process``'s, shared with vLLM).

Protocol, checked against SGLang's source (the ``sglang`` 0.5.23 wheel: ``srt/entrypoints/
http_server.py``, ``srt/managers/io_struct.py``, ``srt/sampling/sampling_params.py``,
``api/v1/api_types.py``, ``srt/arg_groups/fields/*``; and 0.5.3, the lower bound of the
``sglang`` extra, for the same names):

- ``GET /health``: 503 while the server starts, 200 once it serves.
- ``POST /generate`` with ``input_ids`` (a list of prompts: one copy per sample),
  ``sampling_params`` (a list, one per sample: ``max_new_tokens``, ``temperature``,
  ``top_p``, ``top_k`` (-1: off), ``stop_token_ids``, ``ignore_eos``, ``sampling_seed``),
  ``return_logprob``; the reply is a list of ``{"output_ids": [...], "meta_info":
  {"output_token_logprobs": [[logprob, token_id, text], ...], "finish_reason": ...}}``.
  SGLang's schema rejects unknown sampling keys, so only these are sent.
- ``POST /update_weights_from_disk`` ``{"model_path", "load_format"}`` ->
  ``{"success", "message", "num_paused_requests"}`` (HTTP 400 when it failed); the load
  format is explicit since the server's own is ``dummy`` when it starts without weights.
- ``POST /flush_cache``: plain text, 200 (400 while requests run).
- ``POST /release_memory_occupation`` / ``/resume_memory_occupation`` ``{}`` (all tags:
  weights and KV cache; needs ``--enable-memory-saver``, and ``--enable-weights-cpu-backup``
  so the weights come back): ``null``.

Why one sample per request instead of SGLang's ``n``: SGLang copies a request's sampling
params to its ``n`` samples, so under ``--enable-deterministic-inference`` (the only mode in
which it honours ``sampling_seed``) the ``n`` samples of a seeded request would all be
equal. Each sample gets its own seed from its group's key instead (31 bits: 0.5.3 keeps the
seeds as int32); without deterministic inference SGLang ignores them and samples from its
own generator (``--random-seed``).
"""

from __future__ import annotations

import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple

import torch

from siirl.engine.rollout import server_process
from siirl.engine.rollout.server_process import ServerError, ServerProcess

MARKER_ENV = "SIIRL_SGLANG_SERVER"
# copied next to the weights: the directory is a model directory SGLang can read
MODEL_FILES = ("config.json", "generation_config.json")


class SGLangServerError(ServerError):
    """The rollout's SGLang server did not start, refused a request, or crashed again after
    its restart."""


class SGLangServer(ServerProcess):
    """One ``python -m sglang.launch_server`` process."""

    label = "SGLang"
    error = SGLangServerError
    marker_env = MARKER_ENV

    def command(self) -> List[str]:
        return [sys.executable, "-m", "sglang.launch_server", *self.args,
                "--host", "127.0.0.1", "--port", str(self.port)]


def parse_sample(reply: Dict[str, Any]) -> Tuple[List[int], Optional[List[float]]]:
    """``(token ids, their log-probs or None)`` of one ``/generate`` result."""
    meta = reply.get("meta_info") or {}
    finish = meta.get("finish_reason") or {}
    if isinstance(finish, dict) and finish.get("type") == "abort":
        raise SGLangServerError(f"the rollout's SGLang server aborted a request: "
                                f"{finish.get('message')}")
    ids = [int(t) for t in reply["output_ids"]]
    entries = meta.get("output_token_logprobs")
    if not entries or any(entry[0] is None for entry in entries):
        return ids, None
    if [int(entry[1]) for entry in entries] != ids:
        raise SGLangServerError("the rollout's SGLang server returned log-probs for other "
                                "tokens than output_ids (meta_info.output_token_logprobs)")
    return ids, [float(entry[0]) for entry in entries]


class SGLangEngine(server_process.ServerEngine):
    """The engine of the ``sglang`` rollout (``SGLangRollout.llm``): an
    :class:`SGLangServer`, the weight files of the latest sync, one restart after a crash;
    ``sample``, ``reload_weights``, ``sleep``, ``wake_up``, ``close`` as vLLM's engine."""

    def __init__(self, args: List[str], timeout_s: float, log_path: Path, model_dir: str,
                 server: Optional[SGLangServer] = None):
        self.model_dir = Path(model_dir)
        self._released = False  # memory released (sleep): resume before the next call
        super().__init__(server or SGLangServer(args, timeout_s, log_path))

    def _restarted_fresh(self) -> None:
        self._released = False  # a new server holds its memory

    # -- sleep mode (CUDA): weights to the CPU, KV cache freed -----------------------------
    def sleep(self, level: int = 1) -> None:
        if not self._released:
            self._call(lambda: self.server.post("/release_memory_occupation", {}))
            self._released = True

    def wake_up(self) -> None:
        if self._released:  # resuming what was not released is an error in SGLang
            self._call(lambda: self.server.post("/resume_memory_occupation", {}))
            self._released = False

    # -- weight sync ----------------------------------------------------------------------
    def _write(self, named: Iterable[Tuple[str, torch.Tensor]], target: Path) -> None:
        super()._write(named, target)
        for name in MODEL_FILES:
            if (self.model_dir / name).is_file():
                shutil.copyfile(self.model_dir / name, target / name)

    def _reload(self, weights_dir: Path) -> None:
        reply = self.server.post("/update_weights_from_disk",
                                 {"model_path": str(weights_dir), "load_format": "safetensors"})
        if not (isinstance(reply, dict) and reply.get("success")):
            raise SGLangServerError(f"the rollout's SGLang server did not load the weights "
                                    f"of {weights_dir}: {reply}")
        self.server.post("/flush_cache")  # cached keys/values of the old weights

    # -- generation -----------------------------------------------------------------------
    def sample(self, prompts: List[List[int]], requests: List[List[Dict[str, Any]]]
               ) -> List[Tuple[List[int], Optional[List[float]]]]:
        """``[(token ids, their log-probs or None)]`` of every prompt's samples, in order:
        one ``/generate`` per prompt (its samples as a batch of copies, each with its own
        sampling params), all in flight at once."""
        bodies = [{"input_ids": [list(prompt)] * len(params), "sampling_params": params,
                   "return_logprob": True, "stream": False}
                  for prompt, params in zip(prompts, requests, strict=True)]

        def send_all() -> list:
            with ThreadPoolExecutor(max_workers=max(1, min(len(bodies), 64))) as pool:
                return list(pool.map(lambda body: self.server.post("/generate", body),
                                     bodies))

        samples: List[Tuple[List[int], Optional[List[float]]]] = []
        for body, reply in zip(bodies, self._call(send_all), strict=True):
            results = reply if isinstance(reply, list) else [reply]
            if len(results) != len(body["input_ids"]):
                raise SGLangServerError(f"the rollout's SGLang server returned "
                                        f"{len(results)} results for "
                                        f"{len(body['input_ids'])} samples")
            samples.extend(parse_sample(result) for result in results)
        return samples
