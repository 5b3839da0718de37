"""The repository's prose holds together (issue #41: a broken code fence, and timings and counts
that disagreed between the README, the guide and what runs)."""
from __future__ import annotations

import pytest

from support import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_code_fence_closes_on_a_line_of_its_own(doc):
    """A fence closed with text after it (``` `--gpu` takes ...) swallows the prose that follows
    into the code block, up to the next fence."""
    inside, opened = False, None
    for number, line in enumerate(doc.read_text().splitlines(), 1):
        if not line.startswith("```"):
            continue
        if inside:
            assert line.strip() == "```", f"{doc.name}:{number}: a fence closes with text after it: {line!r}"
        else:
            opened = number
        inside = not inside
    assert not inside, f"{doc.name}:{opened}: a code fence never closes"


def _measured() -> dict:
    import json

    return json.loads((REPO / "docs" / "measured.json").read_text())


def _wall_phrase(measured: dict) -> str:
    """The sweep's wall time as the docs state it: the two sweeps' mean, to 5 s."""
    walls = [side["wall_s"] for side in measured["sweeps"].values()]
    minutes, seconds = divmod(round(sum(walls) / len(walls) / 5) * 5, 60)
    return f"about {minutes} min {seconds} s"


def test_the_default_sweeps_timings_and_counts_come_from_the_measured_record():
    """docs/measured.json (bench repeatability --json on the default config) is the one source of the
    figures the README and the guide state, and it measured the sweep config.yaml plans now."""
    import yaml

    from scalelab.planning.sweep import sweep_points

    measured = _measured()
    runs = len(sweep_points(yaml.safe_load((REPO / "config.yaml").read_text())))
    assert {side["runs"] for side in measured["sweeps"].values()} == {runs}, "config.yaml's sweep changed: measure again"
    phrase = _wall_phrase(measured)
    for doc in (REPO / "README.md", REPO / "docs" / "guide.md"):
        text = " ".join(doc.read_text().split())
        assert phrase in text, f"{doc.name} does not state the measured wall time ({phrase})"
        assert f"{runs} runs" in text, f"{doc.name} does not state the {runs} runs"


def test_the_readmes_picture_is_of_a_current_report():
    """docs/img/report.png is drawn by `python -m scalelab.harness.screenshot RESULTS` of a default sweep,
    which stamps what it shows: a picture of tables of another schema, or of another sweep, is stale."""
    from scalelab.harness.screenshot import read_stamp
    from scalelab.planning.columns import SCHEMA_VERSION

    stamp = read_stamp(REPO / "docs" / "img" / "report.png")
    assert stamp.get("scalelab-schema") == SCHEMA_VERSION, (
        f"docs/img/report.png shows tables of schema {stamp.get('scalelab-schema')}, not {SCHEMA_VERSION}: "
        "python -m scalelab.harness.screenshot results (of a default sweep) draws it again")
    assert stamp["scalelab-runs"] == str(_measured()["sweeps"]["A"]["runs"]) == stamp["scalelab-ok-runs"]
    assert "![The default sweep's report](docs/img/report.png)" in (REPO / "README.md").read_text()


def test_every_test_file_the_repository_names_exists():
    """The docs, the code's docstrings and the config cite test files (tests/<tier>/test_<subject>.py,
    or a glob over the tier folders for a subject tested in several): each names a file that exists, so a test
    moved or renamed takes its citations along."""
    import re
    import subprocess

    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    cited = {}
    for name in tracked:
        path = REPO / name
        if name == "CHANGELOG.md" or name.startswith("results/") or path.suffix not in (".py", ".md", ".toml", ".smk", ".sh", ".yaml", ""):
            continue
        if not path.is_file():
            continue
        for found in re.findall(r"\btests/[\w*./-]+\.py\b", path.read_text(errors="replace")):
            cited.setdefault(found, name)
    assert len(cited) > 20
    missing = {path: where for path, where in cited.items() if not list(REPO.glob(path))}
    assert not missing, f"cited test files that do not exist: {missing}"


def test_the_drill_table_is_what_the_drills_own_command_recorded():
    """docs/reliability.md's drill table is rendered from docs/drills.json, which `PYTHONPATH=tests python -m devtools.faults
    --record` writes from one run of every drill: each drill is in it, none failed, nothing was lost."""
    import json

    from devtools.drill_record import DOC, RECORD, TABLE_BEGIN, TABLE_END, drills_table
    from devtools.faults import DRILLS

    record = json.loads(RECORD.read_text())
    assert [row["drill"] for row in record["drills"]] == list(DRILLS), "every drill, recorded in one run"
    for row in record["drills"]:
        assert row["checks_failed"] == [] and row["faults_recovered"] == row["faults_injected"], row
        assert (row["rows_lost"], row["rows_duplicated"], row["corrupt_files"], row["orphan_processes"]) == (0, 0, 0, 0), row
        assert row["does"] == " ".join((DRILLS[row["drill"]].__doc__ or "").split()), "the docstring the drill has now"
    shown = DOC.read_text().split(TABLE_BEGIN, 1)[1].split(TABLE_END, 1)[0]
    assert shown.strip() == drills_table(record).strip()
