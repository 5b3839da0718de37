"""The commands the docs show run as written: every fenced `scalelab estimate` and `scalelab plan` line of the README
and docs/ (cheap: they compute, in process) exits 0, so that a renamed flag or a removed option cannot leave a doc
telling users to type what fails."""
import shlex

import pytest

from scalelab.cli import main
from support.doc_commands import fenced_commands

COMMANDS = fenced_commands(r"scalelab (estimate|plan)\b")


def test_the_docs_show_such_commands():
    assert len(COMMANDS) >= 8, COMMANDS  # the walk below reads them: an empty list would hold nothing


@pytest.mark.parametrize("doc, line, command", COMMANDS, ids=[f"{d}:{n}" for d, n, _ in COMMANDS])
def test_a_documented_command_runs_as_written(doc, line, command, capsys):
    try:
        code = main(shlex.split(command)[1:])
    except SystemExit as err:  # --help, or argparse refusing a flag the doc still shows
        code = err.code
    out, err = capsys.readouterr()
    assert code == 0, f"{doc}:{line}: `{command}` exits {code}: {err.strip()[-500:]}"
