# Stage 1: corpus -> results/data/<dataset>/{train,val}.bin + meta.json (np.memmap tokens).


rule prepare_data:
    input:
        dataset_inputs,
    output:
        train=DATA_DIR / "train.bin",
        val=DATA_DIR / "val.bin",
        meta=DATA_DIR / "meta.json",
    params:
        # what the data depends on (scalelab.planning.sweep.data_result_params): a new key at its default re-prepares nothing
        dataset=data_result_params(config),
        seq_len=config["model"]["seq_len"],
    log:
        LOGS / "data" / f"{DATASET}.log",
    threads: 1
    conda:
        "../workflow/envs/scalelab.yaml"
    script:
        "../workflow/scripts/prepare_data.py"
