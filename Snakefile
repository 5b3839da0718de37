# scalelab: reproducible scaling experiments (precision x ZeRO stage x world size).
# Table of contents only: helpers live in rules/common.smk, one stage per rules/*.smk.
from snakemake.utils import min_version, validate

from scalelab.config import ConfigError, check_moved_keys, check_yaml_syntax

min_version("9.14.8")

# A malformed config file is named with its line and column (Snakemake's parser does not).
for _config_file in ["config.yaml", *workflow.overwrite_configfiles]:
    try:
        check_yaml_syntax(_config_file)
    except ConfigError as err:
        raise WorkflowError(f"invalid config: {err}") from None


configfile: "config.yaml"


try:
    check_moved_keys(config)  # a key of an earlier layout: say where it went
except ConfigError as err:
    raise WorkflowError(f"invalid config: {err}") from None
validate(config, "workflow/schemas/config.schema.yaml")


include: "rules/common.smk"
include: "rules/data.smk"
include: "rules/train.smk"
include: "rules/collect.smk"
include: "rules/report.smk"


# The chain ends at the report; with run files present, rebuilding it trains nothing.
rule all:
    input:
        RESULTS / "report" / "report.html",
