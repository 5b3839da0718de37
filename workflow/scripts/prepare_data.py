"""Snakemake adapter: prepare the dataset (scalelab.run.data.prepare_dataset)."""
import logging
from pathlib import Path

from scalelab.config import dataset_config
from scalelab.run.data import prepare_dataset

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO, format="%(asctime)s %(message)s")
cfg = dataset_config(snakemake.config)  # the whole section (params hold what the data depends on)
meta = prepare_dataset(cfg, Path(snakemake.output.meta).parent, seq_len=snakemake.params.seq_len)
logging.info("prepared %s: %d train + %d val tokens (%s, vocab %d)", cfg.name,
             meta["n_train_tokens"], meta["n_val_tokens"], meta["dtype"], meta["vocab_size"])
