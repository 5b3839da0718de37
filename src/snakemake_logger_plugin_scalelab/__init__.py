"""A Snakemake logger plugin ("scalelab", enabled by profiles/default) that says where a
``--configfile`` stops being YAML.

Snakemake reads ``--configfile`` files itself, before the Snakefile and so before any of the
workflow's checks, and for one that is not YAML it says only "Config file is not valid JSON or
YAML": its loader drops the parser's file, line and column (they are in the traceback that
``--verbose`` prints). A logger plugin is the one piece of this repository Snakemake runs that
early. This handler waits for that message, takes the config files named on the command line
(parsed by Snakemake's own argument parser), and for each one Snakemake's own loader refuses,
logs the file, line, column and problem, as ``scalelab check-config`` would. Every other record
passes untouched: it writes nothing else, and Snakemake's stream handler stays in place.

It is active where profiles/default is (not with ``--workflow-profile none``, nor with a
``--logger`` on the command line, which replaces the profile's list), and it sees only files given
on the command line, not a ``configfile`` set in a profile: there it says nothing.
"""
from __future__ import annotations

import logging
import sys

from snakemake_interface_logger_plugins.base import LogHandlerBase

NOT_YAML = "Config file is not valid JSON or YAML"  # snakemake/common/configfile.py (9.x)
_OURS = "scalelab_located"  # marks this handler's own records, which come back to it


def _refuse(message: str):
    raise ValueError(message)


def command_line_configfiles(argv: list[str]) -> list[str]:
    """The files given with --configfile / --configfiles, as Snakemake's parser reads argv; [] if
    it cannot (another program embedding Snakemake, an argv it refuses)."""
    from snakemake.cli import get_argument_parser

    parser = get_argument_parser()
    parser.error = _refuse  # argparse would print its usage and exit the process
    try:
        args, _ = parser.parse_known_args(argv)
    except (ValueError, SystemExit):  # only a hint: say nothing rather than something wrong
        return []
    return [str(path) for path in (getattr(args, "configfile", None) or [])]


def locate(paths: list[str]) -> list[str]:
    """For each file Snakemake's own loader refuses: "<file>: not valid YAML at line L, column C:
    <problem>" (the position from scalelab's reader, the same YAML parser). Files Snakemake reads
    are left alone, even where scalelab's stricter checks will refuse them later, by name."""
    from snakemake.common.configfile import load_configfile

    from scalelab.config import ConfigError
    from scalelab.config.reading import read_yaml

    messages = []
    for path in paths:
        try:
            load_configfile(path)
            continue  # Snakemake reads it: not the file its message is about
        except Exception:  # WorkflowError, or what opening the file raises
            pass
        try:
            read_yaml(path)
        except ConfigError as err:
            messages.append(str(err))
        except Exception:  # unreadable, not UTF-8: Snakemake's own message stands alone
            pass
    return messages


class LogHandler(LogHandlerBase):
    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno < logging.ERROR or getattr(record, _OURS, False) or NOT_YAML not in str(record.msg):
            return
        try:
            messages = locate(command_line_configfiles(sys.argv[1:]))
        except Exception:  # an error raised here would end Snakemake's logging thread
            return
        for message in messages:
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
        return True  # it sees every record and picks the one it acts on itself

    @property
    def has_formatter(self) -> bool:
        return True  # it formats nothing

    @property
    def needs_rulegraph(self) -> bool:
        return False
