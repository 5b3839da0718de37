"""A Snakemake logger plugin ("scalelab", enabled by profiles/default) that says where a
``--configfile`` stops being YAML.

Snakemake reads ``--configfile`` files itself, before the Snakefile and so before any of the
workflow's checks, and for one that is not YAML it says only "Config file is not valid JSON or
YAML": its loader drops the parser's file, line and column (they are in the traceback that
``--verbose`` prints). A logger plugin is the one piece of this repository Snakemake runs that
early. This handler waits for that message, reads the config files named on the command line
(parsed by Snakemake's own argument parser) and logs, for each one that does not parse, the
file, line, column and problem, as ``scalelab check-config`` would. Every other record passes
untouched: it writes nothing else, and Snakemake's own stream handler stays in place.
"""
from __future__ import annotations

import contextlib
import io
import logging
import sys

from snakemake_interface_logger_plugins.base import LogHandlerBase

NOT_YAML = "file is not valid JSON or YAML"  # snakemake/common/configfile.py (9.x)
_OURS = "scalelab_located"  # marks this handler's own records, which come back to it


def command_line_configfiles(argv: list[str]) -> list[str]:
    """The files given with --configfile / --configfiles, as Snakemake's parser reads argv; [] if
    it cannot (another program embedding Snakemake, an argv it refuses)."""
    from snakemake.cli import get_argument_parser

    try:
        with contextlib.redirect_stderr(io.StringIO()):  # argparse prints what it refuses, then exits
            args, _ = get_argument_parser().parse_known_args(argv)
    except (SystemExit, Exception):  # this is only a hint: say nothing rather than something wrong
        return []
    return [str(path) for path in (getattr(args, "configfile", None) or [])]


def locate(paths: list[str]) -> list[str]:
    """For each file that is not valid YAML: "<file>: not valid YAML at line L, column C: <problem>"."""
    from scalelab.config import ConfigError, read_yaml

    messages = []
    for path in paths:
        try:
            read_yaml(path)
        except ConfigError as err:
            messages.append(str(err))
        except OSError:  # missing or unreadable: Snakemake names those itself
            pass
    return messages


class LogHandler(LogHandlerBase):
    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno < logging.ERROR or getattr(record, _OURS, False) or NOT_YAML not in str(record.msg):
            return
        for message in locate(command_line_configfiles(sys.argv[1:])):
            # Through Snakemake's logger, so its stream handler prints it like its own errors.
            logging.getLogger("snakemake.logging").error(message, extra={_OURS: True})

    @property
    def writes_to_stream(self) -> bool:
        return False  # it logs through Snakemake's logger; Snakemake's stream handler prints

    @property
    def writes_to_file(self) -> bool:
        return False

    @property
    def has_filter(self) -> bool:
        return True  # it sees every record; Snakemake's default filter would drop some errors' twins

    @property
    def has_formatter(self) -> bool:
        return True  # it formats nothing

    @property
    def needs_rulegraph(self) -> bool:
        return False
