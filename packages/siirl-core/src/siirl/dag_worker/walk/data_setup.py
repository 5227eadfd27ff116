"""Each worker's dataloaders: its slice of every global training batch (its share of each
PPO mini-batch, ``siirl.params.mini_batch_layout``), and its share of the validation set
(round-robin rows; validation metrics are combined over all workers).

With ``data.train_files``/``data.val_files`` unset, the built-in task ``data.builtin_task``
(arithmetic by default) is written as parquet under ``<trainer.default_local_dir>/data/``
(once, in files named after the task, so switching tasks in one run dir never reads the other
task's rows) and read from there, so the default job shows users the dataset format it
expects.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Tuple

from siirl.errors import ConfigError
from siirl.params.mini_batch_layout import loader_mini_batches

BUILTIN_TRAIN_SIZE, BUILTIN_VAL_SIZE = 2000, 200


def resolve_data_files(config: Any) -> Tuple[Any, Any]:
    train, val = config.data.train_files, config.data.val_files
    if train is not None and val is not None:
        return train, val
    from siirl.data_coordinator.tasks import task_module

    name = config.data.builtin_task
    task = task_module(name)
    directory = Path(config.trainer.default_local_dir) / "data"
    # arithmetic keeps the names it always had (run dirs made before the key still resume)
    prefix = "" if name == "arithmetic" else f"{name}_"
    train_path, val_path = directory / f"{prefix}train.parquet", directory / f"{prefix}val.parquet"
    if not (train_path.exists() and val_path.exists()):
        directory.mkdir(parents=True, exist_ok=True)
        seed = config.data.seed
        train_rows, val_rows = task.make_splits(BUILTIN_TRAIN_SIZE, BUILTIN_VAL_SIZE, seed=seed)
        task.write_parquet(train_rows, str(train_path))  # val problems never appear in train
        task.write_parquet(val_rows, str(val_path))
    return (train if train is not None else str(train_path),
            val if val is not None else str(val_path))


def dynamic_sampling(config: Any) -> bool:
    """DAPO's dynamic sampling runs in this job (the DAPO workflow, or verl's way)."""
    from siirl.execution.dag.task_loader import builtin_pipeline_name

    dag, enabled = config.dag, config.algorithm.filter_groups.enable
    if dag.custom_pipeline_fn or dag.workflow_path or dag.pipeline:
        return enabled
    return builtin_pipeline_name(config) == "dapo" and enabled


def build_dataloaders(config: Any, tokenizer: Any, rank: int, world_size: int
                      ) -> Tuple[Any, Optional[Any]]:
    from siirl.data_coordinator.dataloader import PartitionedDataset, StatefulDataLoader

    train_files, val_files = resolve_data_files(config)
    data_cfg = config.data
    global_batch = data_cfg.train_batch_size
    if global_batch % world_size:
        raise ConfigError(f"data.train_batch_size={global_batch} must be divisible by the "
                          f"number of workers ({world_size})")
    # Every worker indexes the whole training set and takes its slice of each global batch
    # (see StatefulDataLoader), so the run does not depend on the number of workers.
    train_set = PartitionedDataset(train_files, tokenizer, data_cfg, 0, 1)
    seed = data_cfg.seed
    # each worker's share of every PPO mini-batch: its k-th local mini-batch is then its
    # part of one worker's k-th
    mini_batches = loader_mini_batches(config)
    if dynamic_sampling(config) or config.async_training.enable:
        # a generation round (an asynchronous rollout's call) takes data.gen_batch_size
        mini_batches = 1
        global_batch = data_cfg.gen_batch_size or global_batch
        if global_batch % world_size:
            raise ConfigError(f"data.gen_batch_size={global_batch} must be divisible by the "
                              f"number of workers ({world_size})")
    train_loader = StatefulDataLoader(
        train_set, batch_size=global_batch // world_size, pad_token_id=tokenizer.pad_token_id,
        shuffle=data_cfg.shuffle, seed=seed, drop_last=True,
        rank=rank, num_ranks=world_size, mini_batches=mini_batches)
    val_loader = None
    if val_files:
        val_set = PartitionedDataset(val_files, tokenizer, data_cfg, rank, world_size)
        val_batch = data_cfg.val_batch_size or len(val_set)
        val_loader = StatefulDataLoader(val_set, batch_size=int(val_batch),
                                        pad_token_id=tokenizer.pad_token_id, shuffle=False,
                                        seed=seed, drop_last=False)
    return train_loader, val_loader
