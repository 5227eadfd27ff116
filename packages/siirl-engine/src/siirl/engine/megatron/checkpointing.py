"""Checkpoints of the megatron engines: weights through ``megatron.core.dist_checkpointing``
(each rank writes its part; reshardable to other TP/PP sizes), optimizer moments one file
per tensor x pipeline shard (data-parallel replicas are identical, so data-parallel rank 0
writes them), lr schedule and update count once, plus any replicated extra modules (the
critic's value head, which lives on the last pipeline stage).
"""

from __future__ import annotations

import glob
import logging
import os
from typing import Dict

import torch

from siirl.errors import ConfigError

logger = logging.getLogger(__name__)
DIST_CKPT, EXTRA_FILE, EXTRAS_FILE = "dist_ckpt", "extra.pt", "replicated_modules.pt"


def _tp_rank() -> int:
    from megatron.core import parallel_state

    return parallel_state.get_tensor_model_parallel_rank()


def _writes_extras() -> bool:
    """One rank of the data-parallel rank 0 replicas writes the replicated files: TP rank 0
    of the last pipeline stage (the stage that holds the value head)."""
    from megatron.core import parallel_state

    return _tp_rank() == 0 and parallel_state.is_pipeline_last_stage()


def optimizer_file() -> str:
    from megatron.core import parallel_state

    tp = parallel_state.get_tensor_model_parallel_world_size()
    pp = parallel_state.get_pipeline_model_parallel_world_size()
    name = "optimizer"
    if tp > 1:
        name += f".tp{_tp_rank()}"
    if pp > 1:
        name += f".pp{parallel_state.get_pipeline_model_parallel_rank()}"
    return name + ".pt"


def _is_megatron_optimizer(optimizer) -> bool:
    from siirl.engine.megatron.optimizer_adapter import MegatronOptimizer

    return isinstance(optimizer, MegatronOptimizer)


class MegatronCheckpointed:
    """Mixin: the engine has ``megatron_model``, ``optimizer``, ``_scheduler()``,
    ``trainer`` (counts updates), ``rank`` (data-parallel), ``_contents(key)``; it may
    override ``replicated_modules()`` and ``after_load()``."""

    def replicated_modules(self) -> Dict[str, torch.nn.Module]:
        return {}

    def after_load(self) -> None:
        pass

    def save_checkpoint(self, directory: str) -> None:
        from megatron.core import dist_checkpointing

        contents = self._contents("save_contents")
        os.makedirs(os.path.join(directory, DIST_CKPT), exist_ok=True)
        if "model" in contents:
            dist_checkpointing.save(self.megatron_model.sharded_state_dict(),
                                    os.path.join(directory, DIST_CKPT))
        if "optimizer" in contents and _is_megatron_optimizer(self.optimizer):
            self.optimizer.save(directory, write_layout=torch.distributed.get_rank() == 0)
        elif self.rank == 0 and "optimizer" in contents:
            torch.save(self.optimizer.state_dict(), os.path.join(directory, optimizer_file()))
        if self.rank == 0 and _writes_extras():
            if "extra" in contents:
                torch.save({"lr_scheduler": self._scheduler().state_dict(),
                            "update_count": self.trainer.update_count},
                           os.path.join(directory, EXTRA_FILE))
            if "model" in contents and self.replicated_modules():
                torch.save({k: m.state_dict() for k, m in self.replicated_modules().items()},
                           os.path.join(directory, EXTRAS_FILE))
        torch.distributed.barrier()

    def load_checkpoint(self, directory: str) -> None:
        from megatron.core import dist_checkpointing

        contents = self._contents("load_contents")
        model_dir = os.path.join(directory, DIST_CKPT)
        if "model" in contents:
            if not os.path.isdir(model_dir):
                raise ConfigError(f"checkpoint {directory} has no {DIST_CKPT}/ (not written "
                                  "by the megatron engine)")
            state = dist_checkpointing.load(self.megatron_model.sharded_state_dict(), model_dir)
            self.megatron_model.load_state_dict(state)
            extras = os.path.join(directory, EXTRAS_FILE)
            if self.replicated_modules() and os.path.exists(extras):
                saved = torch.load(extras, weights_only=True)
                for name, module in self.replicated_modules().items():
                    module.load_state_dict(saved[name])
        optim = os.path.join(directory, optimizer_file())
        if "optimizer" in contents and _is_megatron_optimizer(self.optimizer):
            if not self.optimizer.load(directory):
                logger.warning("%s holds no optimizer state for this run's TP/PP/DP sizes "
                               "(megatron's distributed optimizer shards it by them); the "
                               "weights were resharded, the optimizer starts fresh", directory)
        elif "optimizer" in contents and os.path.exists(optim):
            self.optimizer.load_state_dict(torch.load(optim, weights_only=True))
        elif "optimizer" in contents and glob.glob(os.path.join(directory, "optimizer*.pt")):
            # written at other TP/PP sizes: weights reshard, moments do not
            logger.warning("%s holds optimizer state for other tensor/pipeline-parallel sizes "
                           "than this run's; the weights were resharded, the optimizer starts "
                           "fresh", directory)
        extra_path = os.path.join(directory, EXTRA_FILE)
        if "extra" in contents and os.path.exists(extra_path):
            extra = torch.load(extra_path, weights_only=True)
            self._scheduler().load_state_dict(extra["lr_scheduler"])
            self.trainer.update_count = int(extra["update_count"])
        self.pristine = False
        self.after_load()
