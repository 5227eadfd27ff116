"""Convert a Hugging Face model once into a megatron-core distributed checkpoint, which a run
then starts from with ``<role>.megatron.use_dist_checkpointing=true`` and
``<role>.megatron.dist_checkpointing_path=<folder>`` (docs/megatron.md)::

    python tools/megatron_dist_checkpoint.py builtin:tiny-arith /tmp/tiny_arith_mcore
    torchrun --nproc-per-node 8 tools/megatron_dist_checkpoint.py <hf dir> <folder> --tp 8

The checkpoint is written at the layout given (TP=1 PP=1 by default: one process on the
CPU over gloo) and loads at any other TP/PP/EP layout. Under torchrun each rank converts
only its own shard of the HF weights (every rank still reads the HF model once).
"""

from __future__ import annotations

import argparse
import os

import torch


def convert(model_path: str, out: str, tp: int = 1, pp: int = 1, ep: int = 1,
            dtype: torch.dtype = torch.float32) -> None:
    """Collective over the ranks of the process group (started here when there is none)."""
    import torch.distributed as dist
    from megatron.core import parallel_state, tensor_parallel

    from siirl.engine.megatron.cpu_compat import enable_cpu_mode
    from siirl.engine.megatron.dist_checkpoint import save_model
    from siirl.engine.megatron.rank_order import initialize_parallel_state
    from siirl.engine.megatron.setup import build_megatron_model, ensure_distributed
    from siirl.engine.models.loader import load_model

    enable_cpu_mode()
    if not dist.is_initialized() and "WORLD_SIZE" in os.environ:  # under torchrun
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    ensure_distributed()
    initialize_parallel_state(tp, pp, ep=ep)
    tensor_parallel.model_parallel_cuda_manual_seed(0)
    hf_model = load_model({"path": model_path}, dtype=torch.float32)
    model = build_megatron_model(hf_model, torch.device("cpu"), params_dtype=dtype)
    save_model(model, out)
    parallel_state.destroy_model_parallel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="HF model directory, hub id in the local cache, or "
                                      "builtin:tiny-arith")
    parser.add_argument("out", help="the checkpoint folder to write (new or empty)")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size to write at")
    parser.add_argument("--pp", type=int, default=1, help="pipeline-parallel size to write at")
    parser.add_argument("--ep", type=int, default=1, help="expert-parallel size (MoE)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                        help="weights' dtype in the checkpoint (a run loads it into its own)")
    args = parser.parse_args()
    if os.path.isdir(args.out) and os.listdir(args.out):
        parser.error(f"{args.out} is not empty: give a new or empty folder")
    convert(args.model, args.out, args.tp, args.pp, args.ep, getattr(torch, args.dtype))
    import torch.distributed as dist

    if dist.get_rank() == 0:
        print(f"wrote a megatron distributed checkpoint of {args.model} to {args.out}")


if __name__ == "__main__":
    main()
