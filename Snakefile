# scalelab: reproducible scaling experiments (precision x ZeRO stage x world size).
# Table of contents only: helpers live in rules/common.smk, one stage per rules/*.smk.
from pathlib import Path

from snakemake.logging import logger
from snakemake.utils import min_version

from scalelab.config import ConfigError, ConfigProblems
from scalelab.config.reading import check_yaml_syntax
from scalelab.planning.validation import validate_config, validation_message

min_version("9.14.8")

# A malformed config file, or one giving a key twice, is named with its line and column
# (Snakemake's parser names neither and keeps the last value). Snakemake reads --configfile
# files itself before this file runs: one that is not YAML at all stops there, with
# Snakemake's message ("Config file is not valid JSON or YAML"), located by the scalelab logger
# plugin (profiles/default); one that parses reaches this loop, and a duplicated key in it is named here.
# Every file is read before any is reported: all their problems at once.
CONFIG_FILES = ["config.yaml", *workflow.overwrite_configfiles]  # merged in this order: the last that sets a key wins
_syntax_errors = []
for _config_file in CONFIG_FILES:
    try:
        check_yaml_syntax(_config_file)
    except ConfigError as err:
        _syntax_errors.append(err)
if _syntax_errors:
    raise WorkflowError(validation_message(ConfigProblems([str(err) for err in _syntax_errors]))) from None


configfile: "config.yaml"


# The one validation path (scalelab.planning.validation.validate_config): schema with defaults, then the
# cross-field rules. Bad values stop the workflow here, before any job: every problem at once, one
# line each, naming the file and line that set the key (Snakemake merged the files into `config`, so
# they are read again to find them), the key and the value.
try:
    # paths are relative to the working directory; the users' modules are tried by the process that plans the jobs,
    # not again by every job that parses this file (a SLURM job: its launcher fails its run on a module that breaks)
    validate_config(config, base_dir=Path.cwd(), files=CONFIG_FILES,
                    try_modules=not (workflow.remote_exec or workflow.subprocess_exec))
except ConfigError as err:
    raise WorkflowError(validation_message(err)) from None


include: "rules/common.smk"
include: "rules/data.smk"
include: "rules/train.smk"
include: "rules/bench.smk"
include: "rules/collect.smk"
include: "rules/report.smk"
include: "rules/hooks.smk"  # the invocation's start and end: the results lock, its record, the closing lines


# The chain ends at the report; with run files present, rebuilding it trains nothing.
rule all:
    input:
        RESULTS / "report" / "report.html",
