"""The formulas: parameters and FLOPs (flops), memory per rank (model_state, activation_memory,
peak_memory), bytes per step (communication, tensor_parallelism, lora_training), the bytes per link
(links), and a run's predicted columns (predicted_columns). Planning, the worker, collection and
the report all read them; none of them measures anything."""
