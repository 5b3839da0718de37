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

It is also the console's stream handler (``writes_to_stream``), to keep a sweep's console to one
line per job: Snakemake's own handler prints, per job, its inputs, outputs, reason and every
resource (200-character paths, and SLURM-only resources such as ``slurm_extra`` and ``mem_mb`` on
a laptop), ~27 KB for an 8-run sweep. Here a job is one line (its progress, rule, run and log),
the banner and job table one line each, and the scheduler's chatter ("Select jobs to
execute...") is left out. Everything else goes through Snakemake's own filter, formatter and
colours unchanged: warnings, errors, and a failed job's block (the failing rule and its log
path); with -n, --verbose or --debug-dag every record is Snakemake's own. The full detail stays
in .snakemake/log/, whose file handler this does not touch.
"""
from __future__ import annotations

import logging
import re
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


# Scheduler messages a sweep's reader does not act on: left out of the console (still in the log file).
CHATTER = ("Select jobs to execute", "Building DAG of jobs", "Using shell:", "Provided cores:",
           "Rules claiming more threads", "Provided resources:", "Conda environments: ignored",
           "Singularity containers: ignored", "Assuming unrestricted shared filesystem usage", "Removing temporary output")


def missing_configfile(message: str, argv: list[str]) -> str | None:
    """The --configfile of the command line that Snakemake's loader found missing (it prints the traceback of
    its FileNotFoundError), or None."""
    found = re.search(r"FileNotFoundError: \[Errno 2\] No such file or directory: '([^']+)'", message)
    return found.group(1) if found and found.group(1) in command_line_configfiles(argv) else None


def _chatter(message: str) -> bool:
    return message.startswith(CHATTER) or re.fullmatch(r"Execute \d+ jobs\.\.\.\s*", message) is not None


# snakemake-executor-plugin-slurm 2.8 declares --slurm-no-account but never reads it: without an
# account it guesses one with `sacct`, which a cluster without accounting storage answers with an
# error, printed as three warnings. Where the user said --slurm-no-account they say nothing.
ACCOUNT_GUESS = ("No SLURM account given, trying to guess.", "No account was given, not able to get a SLURM account via sacct",
                 "Unable to guess SLURM account. Trying to proceed without.")


def account_guess_dropped(message: str, argv: list[str]) -> bool:
    """Whether a record is the SLURM plugin's account guessing that --slurm-no-account asked it not to do."""
    return "--slurm-no-account" in argv and message.startswith(ACCOUNT_GUESS)


def job_line(record: logging.LogRecord, progress: str | None) -> str:
    """One line for a job starting: the time, the rule, its wildcards (a train job's run id), the
    jobs done before it, and its log, relative as Snakemake names it. "starts" first: a count of
    jobs done beside a run's name read as if that run were done."""
    import time

    wildcards = getattr(record, "wildcards", None) or {}
    label = " ".join([str(getattr(record, "rule_name", "job")), *(str(v) for v in wildcards.values())])
    logs = list(getattr(record, "log", None) or [])
    return (f"[{time.strftime('%H:%M:%S')}] starts {label}" + (f" ({progress} before it)" if progress else "")
            + (f"  (log: {logs[0]})" if logs else ""))


class LogHandler(LogHandlerBase):
    def __post_init__(self) -> None:
        from snakemake.logging import ColorizingTextHandler, DefaultFilter, DefaultFormatter

        s = self.common_settings
        # Snakemake's own stream handler, as it would have made it: every record not shortened here goes to it.
        self.inner = ColorizingTextHandler(nocolor=s.nocolor, stream=sys.stdout if s.stdout else sys.stderr)
        self.inner.addFilter(DefaultFilter(s.quiet, s.debug_dag, s.verbose, s.dryrun, s.printshellcmds))
        self.inner.setFormatter(DefaultFormatter(s.quiet, s.show_failed_logs))
        self.detailed = bool(s.dryrun or s.verbose or s.debug_dag)  # asked for the plan or the detail: Snakemake's
        self.progress: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._print(record)
        except Exception:  # an error raised here would end Snakemake's logging thread
            self.handleError(record)
        if record.levelno < logging.ERROR or getattr(record, _OURS, False) or NOT_YAML not in str(record.msg):
            return
        try:
            messages = locate(command_line_configfiles(sys.argv[1:]))
        except Exception:
            return
        for message in messages:
            # Printed by Snakemake's own stream handler (ours wraps it), like Snakemake's errors; not logged
            # again: a record logged from inside this handler, as Snakemake stops on this error, was lost.
            self.inner.handle(logging.makeLogRecord({**record.__dict__, "msg": message, "args": None, "event": None,
                                                     _OURS: True}))

    def _short(self, record: logging.LogRecord, text: str) -> None:
        short = logging.makeLogRecord({**record.__dict__, "msg": text, "args": None, "event": None})
        self.inner.handle(short)

    def _print(self, record: logging.LogRecord) -> None:
        from snakemake_interface_logger_plugins.common import LogEvent

        event = getattr(record, "event", None)
        if event == LogEvent.SHELLCMD and getattr(record, "shellcmd", None) is None:
            return  # a script: rule (every rule here) has no shell command: "Shell command: None" says nothing
        if record.levelno == logging.WARNING and account_guess_dropped(record.getMessage(), sys.argv):
            return
        if record.levelno >= logging.ERROR and (missing := missing_configfile(str(record.msg), sys.argv[1:])):
            self._short(record, f"--configfile {missing}: no such file")  # Snakemake's loader raised: a traceback
            return
        if self.detailed or record.levelno >= logging.WARNING or not self.inner.filter(record):
            self.inner.handle(record)  # the filter (quiet, printshellcmds) is applied again there
            return
        if event == LogEvent.JOB_INFO:
            self._short(record, job_line(record, self.progress))
        elif event == LogEvent.PROGRESS:
            done, total = getattr(record, "done", None), getattr(record, "total", None)
            self.progress = f"{done} of {total} jobs done"
            if done is not None and done == total:
                self.inner.handle(record)  # the closing "N of N steps (100%) done"
        elif event == LogEvent.JOB_FINISHED:
            pass  # the next job's line, or the closing progress, says so
        elif event == LogEvent.WORKFLOW_STARTED:
            files = getattr(record, "configfiles", None) or []
            self._short(record, f"snakemake {getattr(record, 'snakemake_version', '')} in {getattr(record, 'cwd', '')}"
                                + (f", config {', '.join(str(f) for f in files)}" if files else ""))
        elif event == LogEvent.RUN_INFO and isinstance(getattr(record, "stats", None), dict):
            stats = record.stats
            self._short(record, "jobs: " + ", ".join(f"{rule} {n}" for rule, n in stats.items() if rule != "total")
                        + (f" ({stats['total']} in all)" if "total" in stats else ""))
        elif event in (None, LogEvent.RESOURCES_INFO, LogEvent.JOB_STARTED) and _chatter(record.getMessage()):
            pass
        else:
            self.inner.handle(record)

    @property
    def writes_to_stream(self) -> bool:
        return True  # the console's handler: Snakemake adds no stream handler of its own beside it

    @property
    def writes_to_file(self) -> bool:
        return False

    @property
    def has_filter(self) -> bool:
        return True  # it sees every record: Snakemake's filter is applied by its inner handler

    @property
    def has_formatter(self) -> bool:
        return True  # it formats nothing

    @property
    def needs_rulegraph(self) -> bool:
        return False
