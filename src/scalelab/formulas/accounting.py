"""The formulas' former single module, kept while modules that are being edited elsewhere still import
from it: run.worker, plan.sweep, formulas.pipeline and formulas.predicted_columns (and plan.columns' words,
which the data dictionary repeats). New code imports the concept modules: flops, model_state,
communication, tensor_parallelism, activation_memory, peak_memory and lora_training. Delete this module once those
callers read the names from their homes."""
from scalelab.formulas.activation_memory import DTYPE_BYTES, block_activation_bytes, outside_block_activation_bytes
from scalelab.formulas.communication import (
    GRAD_REDUCE,
    MIXED_COMM,
    comm_bytes_by_link,
    comm_bytes_per_step,
    comm_dtypes,
    comm_elements_per_step,
    ddp_bucket_count,
)
from scalelab.formulas.communication import sixteen_bit_params as _sixteen_bit_params
from scalelab.formulas.flops import flops_per_token, mfu, param_count, recompute_flops_per_token
from scalelab.formulas.lora_training import lora_comm_elements_per_step, lora_model_state_bytes, lora_trainable_params
from scalelab.formulas.model_state import ModelStateBytes, model_state_bytes
from scalelab.formulas.peak_memory import PeakMemory, grads_at_peak, peak_memory
from scalelab.formulas.tensor_parallelism import (
    data_parallel_size,
    last_block_params,
    tensor_parallel_bytes,
    tensor_parallel_comm,
    tensor_parallel_params,
)

__all__ = [
    "DTYPE_BYTES", "GRAD_REDUCE", "MIXED_COMM", "ModelStateBytes", "PeakMemory", "_sixteen_bit_params",
    "block_activation_bytes", "comm_bytes_by_link", "comm_bytes_per_step", "comm_dtypes", "comm_elements_per_step",
    "data_parallel_size", "ddp_bucket_count", "flops_per_token", "grads_at_peak", "last_block_params",
    "lora_comm_elements_per_step", "lora_model_state_bytes", "lora_trainable_params", "mfu", "model_state_bytes",
    "outside_block_activation_bytes", "param_count", "peak_memory", "recompute_flops_per_token",
    "tensor_parallel_bytes", "tensor_parallel_comm", "tensor_parallel_params",
]
