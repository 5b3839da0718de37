"""The registries every layer reads, torch-free and independent of any config: precisions, ZeRO
strategies, model families and their named shapes (presets), hardware, which link a group of
ranks talks over (topology), and the collective benchmark's table format (comm_table). The config is checked against them."""
