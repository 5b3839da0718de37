"""The formulas: what one rank runs in a step (rank_step: the value the memory and communication formulas take),
parameters and FLOPs (flops), memory per rank (model_state, activation_memory, peak_memory; other trainers'
recipes: megatron_style, foundry_style), bytes per step (communication, tensor_parallelism, lora_training, pipeline), the bytes and
time per link (links; a link fitted to a `bench comm` table: link_fit; a run's collectives timed on its links:
comm_time), the step's overlap (overlap), and a run's predicted columns (predicted_columns). Planning, the forecast, the worker,
collection and the report all read them; none of them measures anything."""
