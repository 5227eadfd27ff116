"""A stand-in for ``python -m sglang.launch_server`` in tests: SGLang's native HTTP
endpoints with the request and response shapes of SGLang's own source (0.5.23; see
``siirl.engine.rollout.sglang_server``), no model. It checks our client against that
protocol, not SGLang itself.

Run as ``python fake_sglang_server.py <launch flags> --host H --port P --record FILE``. Every
request (path and JSON body) and the launch flags go to FILE as JSON lines. Generated
tokens are a function of the prompt or the sample's seed and of the loaded weights, so a
test can tell which weights a reply came from. ``FAKE_SGLANG_EXIT=<code>`` exits at start,
``FAKE_SGLANG_STARTING=1`` never leaves the starting state (/health 503).
"""

import argparse
import hashlib
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

# SGLang's SamplingParams schema rejects unknown keys (api/v1/api_types.py)
SAMPLING_KEYS = {
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p",
    "top_k", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty",
    "min_new_tokens", "n", "json_schema", "regex", "ebnf", "structural_tag", "ignore_eos",
    "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim",
    "stream_interval", "logit_bias", "sampling_seed", "custom_params"}
STARTING_S = 0.5  # /health answers 503 this long after the server listens


def tensor_digest(tensor) -> str:
    """sha256 of the tensor's bytes (tests compare it with the trainer's own tensors)."""
    import torch

    return hashlib.sha256(tensor.contiguous().view(-1).view(torch.uint8).numpy()
                          .tobytes()).hexdigest()


class State:
    def __init__(self, args, record):
        self.args, self.record = args, record
        self.weights = 0  # an integer drawn from the loaded weights: 0 until a load
        self.released = False
        self.started = time.monotonic()
        self.lock = threading.Lock()
        config = json.loads((Path(args.model_path) / "config.json").read_text())
        self.vocab = int(config["vocab_size"])

    def log(self, entry):
        with self.lock, open(self.record, "a") as out:
            out.write(json.dumps(entry) + "\n")


def generate_one(state, prompt, params):
    unknown = set(params) - SAMPLING_KEYS
    if unknown:  # SGLang: HTTP 400 with the schema's error
        raise ValueError(f"unknown field `{sorted(unknown)[0]}`")
    if params.get("n", 1) != 1:
        raise ValueError("n > 1 is not expected from siiRL's client")
    width = int(params.get("max_new_tokens", 128))
    stops = set(params.get("stop_token_ids") or [])
    greedy = params.get("temperature", 1.0) == 0.0
    base = sum(prompt) if greedy else int(params.get("sampling_seed", 42)) * 31
    ids, entries = [], []
    for j in range(width):
        token = (base + state.weights + 7 * j) % state.vocab
        ids.append(token)
        entries.append([-0.01 * (j + 1), token, None])  # skip_tokenizer_init: no text
        if token in stops and not params.get("ignore_eos", False):
            break
    finish = ({"type": "stop", "matched": ids[-1]} if len(ids) < width
              else {"type": "length", "length": width})
    return {"output_ids": ids,
            "meta_info": {"id": os.urandom(8).hex(), "finish_reason": finish,
                          "prompt_tokens": len(prompt), "completion_tokens": len(ids),
                          "cached_tokens": 0, "output_token_logprobs": entries}}


def load_weights(state, body):
    import torch
    from safetensors.torch import load_file

    path = Path(body["model_path"])
    load_format = body.get("load_format") or state.args.load_format
    files = sorted(path.glob("*.safetensors"))
    if load_format == "dummy" or not files:  # SGLang: only DefaultModelLoader can update
        return 400, {"success": False, "message": f"Failed to load from {path} "
                     f"(load_format={load_format})", "num_paused_requests": 0}
    digests, total = {}, 0
    for file in files:
        for name, tensor in load_file(str(file)).items():
            digests[name] = tensor_digest(tensor)
            total += int(tensor.to(torch.float64).abs().sum().item() * 1000)
    state.weights = total % 997 + 1
    state.log({"loaded": digests, "files": sorted(p.name for p in path.iterdir())})
    return 200, {"success": True, "message": "Succeeded to update model weights.",
                 "num_paused_requests": 0}


def answer(state, path, body):
    """(HTTP status, reply: JSON value or plain text) of a POST."""
    if path == "/generate":
        if state.released:
            raise ValueError("memory is released; resume it first")
        batch = isinstance(body["input_ids"][0], list)
        prompts = body["input_ids"] if batch else [body["input_ids"]]
        params = body["sampling_params"]
        params = params if isinstance(params, list) else [params] * len(prompts)
        out = [generate_one(state, p, s) for p, s in zip(prompts, params, strict=True)]
        return 200, out if batch else out[0]
    if path == "/update_weights_from_disk":
        return load_weights(state, body)
    if path == "/flush_cache":
        return 200, "Cache flushed.\nPlease check backend logs for more details.\n"
    if path == "/release_memory_occupation":
        state.released = True
        return 200, None
    if path == "/resume_memory_occupation":
        if not state.released:  # SGLang: removing a tag that is not released
            raise ValueError("KeyError: 'weights'")
        state.released = False
        return 200, None
    return 404, {"detail": "Not Found"}


def handler(state):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def reply(self, code, body=None, text=None):
            data = text.encode() if text is not None else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain" if text is not None
                             else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            starting = (os.environ.get("FAKE_SGLANG_STARTING")
                        or time.monotonic() - state.started < STARTING_S)
            if self.path == "/health":
                self.reply(503 if starting else 200, text="")
            else:
                self.reply(404, {"detail": "Not Found"})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
            try:
                code, reply = answer(state, self.path, body)
            except (ValueError, KeyError) as exc:  # SGLang's _create_error_response
                code, reply = 400, {"error": {"message": str(exc)}}
            state.log({"path": self.path, "body": body, "code": code, "reply": reply})
            if isinstance(reply, str):
                self.reply(code, text=reply)
            else:
                self.reply(code, reply)

    return Handler


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--load-format", default="auto")
    parser.add_argument("--record", required=True)
    args, _ = parser.parse_known_args()
    if os.environ.get("FAKE_SGLANG_EXIT"):
        print("fake failure: the model cannot be loaded", flush=True)
        sys.exit(int(os.environ["FAKE_SGLANG_EXIT"]))
    state = State(args, args.record)
    state.log({"argv": sys.argv[1:], "pid": os.getpid()})
    ThreadingHTTPServer((args.host, args.port), handler(state)).serve_forever()


if __name__ == "__main__":
    main()
