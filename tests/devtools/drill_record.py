"""The fault drills' record: the figures of their last run (docs/drills.json), and docs/reliability.md's drill
table rendered from it, so that the page states what the drills' own command measured (a test holds the two
together)."""
from __future__ import annotations

import json
import os

from scalelab.harness import REPO_ROOT

RECORD = REPO_ROOT / "docs" / "drills.json"
"""The figures of the last run of every drill (`--record`): docs/reliability.md's drill table is rendered from it."""
DOC = REPO_ROOT / "docs" / "reliability.md"
TABLE_BEGIN, TABLE_END = "<!-- drills: begin (PYTHONPATH=tests python -m devtools.faults --record) -->", "<!-- drills: end -->"
COUNTS = ("faults_injected", "faults_recovered", "rows_lost", "rows_duplicated", "corrupt_files", "orphan_processes")


def drill_row(name: str, docstring: str | None, drill, seconds: float) -> dict:
    """One drill's line of the record: what it does (its docstring), its counts, its checks."""
    doc = " ".join((docstring or "").split())
    return {"drill": name, "does": doc, "seconds": round(seconds, 1), **{k: int(getattr(drill, k)) for k in COUNTS},
            "bad_configs": [int(drill.bad_configs_rejected), int(drill.bad_configs_tried)],
            "timeouts": [int(drill.timeouts_honoured), int(drill.timeouts_tried)], "checks_failed": list(drill.checks_failed)}


def drills_table(record: dict) -> str:
    """docs/reliability.md's drill table, from the record alone."""
    lines = [f"Measured {record['measured']} ({record['machine']}), commit {record['commit']}:", "",
             "| drill | what is done and what must hold | injected / recovered | rows lost / duplicated | corrupt files "
             "| orphans | bad configs or timeouts handled / tried | checks failed | time |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in record["drills"]:
        tried = [f"{done} / {of} {what}" for what, (done, of) in (("configs", row["bad_configs"]), ("timeouts", row["timeouts"]))
                 if of]
        lines.append(f"| `{row['drill']}` | {row['does'].replace('|', chr(92) + '|')} | {row['faults_injected']} / {row['faults_recovered']} | "
                     f"{row['rows_lost']} / {row['rows_duplicated']} | {row['corrupt_files']} | {row['orphan_processes']} | "
                     f"{', '.join(tried) or '-'} | {len(row['checks_failed'])} | {row['seconds']:.0f} s |")
    return "\n".join(lines) + "\n"


def write_record(rows: list[dict]) -> None:
    """docs/drills.json and the table in docs/reliability.md, from this run of every drill."""
    import datetime
    import platform

    from scalelab.run.launch import git_provenance

    record = {"measured": datetime.date.today().isoformat(), "commit": (git_provenance(REPO_ROOT)["git_commit"] or "?")[:7],
              "machine": f"{os.cpu_count()} cores, {platform.machine()}, load {os.getloadavg()[0]:.1f} at the end",
              "drills": rows}
    RECORD.write_text(json.dumps(record, indent=1) + "\n")
    doc = DOC.read_text()
    head, rest = doc.split(TABLE_BEGIN, 1)
    DOC.write_text(head + TABLE_BEGIN + "\n" + drills_table(record) + TABLE_END + rest.split(TABLE_END, 1)[1])
