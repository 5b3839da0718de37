"""The registries every layer reads, torch-free and independent of any config: precisions, ZeRO
strategies, model families and their named shapes (presets), hardware, and which link a group of
ranks talks over. The config is checked against them."""
