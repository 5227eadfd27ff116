"""Settings of the ``data`` section: datasets, prompt keys, lengths and batch sizes.

They live here, with the dataset that reads them, because siirl-data sits below siirl-core:
core's schema (``siirl.params``) imports these classes and mounts ``DataArguments`` at
``data``, so each default is written once, on its field, and the partitioned dataset reads
the attributes of the typed section it is handed. Key names and defaults follow verl's
``ppo_trainer.yaml`` so that verl command-line overrides such as
``data.train_batch_size=256`` keep working.
"""

from dataclasses import dataclass, field
from typing import Any

__all__ = ["CustomClsArguments", "DataArguments", "SamplerArguments"]


@dataclass
class CustomClsArguments:
    """Optional user dataset class, loaded from ``path`` by class ``name``."""

    path: str | None = None
    name: str | None = None


@dataclass
class SamplerArguments:
    """Optional user sampler class for the training dataloader (curriculum etc.)."""

    class_path: str | None = None
    class_name: str | None = None


@dataclass
class DataArguments:
    """Dataset: train/val files, prompt keys, prompt/response lengths, batch sizes."""

    tokenizer: str | None = None
    use_shm: bool = False
    # str or list of str in verl, hence ``Any``.
    train_files: Any = field(
        default=None,
        metadata={"help": "Training parquet/jsonl file(s): a path or a list of paths "
                          "(null: the data.builtin_task task, written under the run dir)."},
    )
    val_files: Any = field(
        default=None,
        metadata={"help": "Validation parquet/jsonl file(s) (null: data.builtin_task's)."},
    )
    builtin_task: str = field(
        default="arithmetic",
        metadata={"help": "The built-in task written under the run dir for train_files/"
                          "val_files left null: arithmetic (1-3 token answers), repeat "
                          "('ab*3=' -> 'ababab', response lengths with a long tail) or "
                          "chat_arithmetic (arithmetic asked in words, for chat models)."},
    )
    prompt_key: str = "prompt"
    reward_fn_key: str = "data_source"
    max_prompt_length: int = field(
        default=512, metadata={"help": "Maximum prompt length in tokens."}
    )
    max_response_length: int = field(
        default=8, metadata={"help": "Maximum generated response length in tokens."}
    )
    train_batch_size: int = field(
        default=32, metadata={"help": "Number of prompts per training step."}
    )
    val_batch_size: int | None = None
    # DAPO recipe: prompts generated per round when dynamic sampling filters groups. The
    # interpolation names the section's mount (``data``), which core's schema fixes.
    gen_batch_size: int = "${data.train_batch_size}"
    return_raw_input_ids: bool = False
    return_raw_chat: bool = False
    return_full_prompt: bool = False
    shuffle: bool = True
    validation_shuffle: bool = False
    seed: int = 1
    dataloader_num_workers: int = 8
    filter_overlong_prompts: bool = False
    filter_overlong_prompts_workers: int = 1
    truncation: str = "error"
    image_key: str = "images"
    video_key: str = "videos"
    trust_remote_code: bool = False
    return_multi_modal_inputs: bool = True
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    custom_cls: CustomClsArguments = field(default_factory=CustomClsArguments)
    sampler: SamplerArguments = field(default_factory=SamplerArguments)
