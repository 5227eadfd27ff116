"""Megatron-core engine pieces (optional extra ``megatron``).

Importing this package does not import megatron-core; the submodules do:

* :mod:`.cpu_compat` -- ``enable_cpu_mode()``: runtime adapters for megatron's CUDA-only spots,
* :mod:`.model` -- TransformerConfig / GPTModel from HF Llama and Qwen2 configs, HF-like logits,
* :mod:`.bridge` -- HF <-> megatron weight conversion for any TP / PP layout.
"""
