"""A new user's first hour, scripted (#32): their own config with mistakes, a small sweep,
status, retry, compare, estimate, and the report opened in Chromium. Each step checks what
a new user met: one line per config problem, a console of one line per job without SLURM
resources, hints that rerun *this* sweep, compare without false alarms, the report's header."""
import json
import subprocess
import sys

import pytest
import yaml

from scalelab.cli import main
from scalelab.harness.screenshot import chromium
from scalelab.harness.testing import snakemake_cmd, snakemake_env, tiny_config, write_workdir
from support.report import _laid_out


@pytest.mark.skipif(chromium() is None, reason="Chromium is not installed (apt-get install chromium; `make browser`)")
def test_a_new_users_first_session(tmp_path, capsys, monkeypatch):
    work = write_workdir(tmp_path / "work", tiny_config())
    monkeypatch.chdir(tmp_path)
    # 1. Their own config, with a typo: refused before any job, one line naming file, line and key.
    mine = {"results_dir": "mine", "model": {"n_layer": 2}, "sweep": {"world_size": [1, 2]}}
    (work / "my.yaml").write_text(yaml.safe_dump(mine, sort_keys=False))
    bad = subprocess.run(snakemake_cmd(work, "--cores", "all", "--configfile", str(work / "my.yaml")),
                         capture_output=True, text=True, timeout=300, env=snakemake_env())
    assert bad.returncode != 0
    problem = [line for line in (bad.stdout + bad.stderr).splitlines() if "n_layer" in line]
    assert problem and "my.yaml" in problem[0] and "n_layers" in problem[0], bad.stderr[-2000:]
    assert not (work / "mine").exists(), "nothing ran"
    # 2. Fixed, the sweep: two runs, one console line per job, no SLURM resources on a local run.
    mine["model"] = {"n_layers": 2}
    (work / "my.yaml").write_text(yaml.safe_dump(mine, sort_keys=False))
    run = subprocess.run(snakemake_cmd(work, "--cores", "all", "--configfile", str(work / "my.yaml")),
                         capture_output=True, text=True, timeout=600, env=snakemake_env())
    console = run.stdout + run.stderr
    assert run.returncode == 0, console[-3000:]
    for word in ("slurm_extra", "mem_mb", "Select jobs to execute", "    output:"):
        assert word not in console, word
    jobs = [line for line in console.splitlines() if "· train " in line or line.startswith("[") and " train " in line]
    assert len(jobs) == 2 and all("(log: mine/logs/runs/" in line for line in jobs), jobs
    assert len(console.splitlines()) < 35 and "Execute 1 jobs" not in console, console
    results = work / "mine"
    # 3. The command that started the sweep is what every hint prints.
    command = json.loads((results / ".scalelab" / "invocation.json").read_text())["command"]
    assert command == f"snakemake --cores all --snakefile {snakemake_cmd(work)[2]} --directory {work} --configfile {work / 'my.yaml'}"
    summary = (results / "runs" / "fp32-z0-w2" / "summary.json")
    data = json.loads(summary.read_text())
    summary.write_text(json.dumps({**data, "status": "failed", "reason": "rank 1: RuntimeError: boom"}))
    assert main(["status", str(results)]) == 0
    out = capsys.readouterr().out
    assert "rank 1: RuntimeError: boom" in out and f"then: scalelab resume {results}" in out, out
    assert f"it runs the sweep's command: {command} --rerun-incomplete)" in out, out
    assert main(["retry", str(results), "--dry-run"]) == 0
    assert "fp32-z0-w2 (failed): would remove" in capsys.readouterr().out
    summary.write_text(json.dumps(data))
    # 4. compare of the sweep with itself: nothing differs, losses agree.
    assert main(["compare", str(results), str(results), "--out", str(tmp_path / "cmp")]) == 0
    md = (tmp_path / "cmp" / "compare.md").read_text()
    assert "provenance differs in: nothing" in md and "what was trained differs" not in md and "2 run(s) identical" in md, md
    # 5. estimate takes counts as it prints them.
    assert main(["estimate", "memory", "--params", "350M", "--zero-stage", "3"]) == 0
    assert "350M parameters" in capsys.readouterr().out
    # 6. The report, in Chromium: what was trained, right under the title.
    shown = _laid_out(results / "report" / "report.html", tmp_path, width=1400)
    top, text = shown["trained"]
    assert top < shown["best"], shown
    for part in ("parameters (layers 2, d_model 32, heads 2)", "sequence length 32", "global batch 8 sequences",
                 "256 tokens per step", "12 steps", "dataset tiny"):
        assert part in text, (part, text)
    assert text in (results / "report" / "summary.md").read_text().replace("**Trained:** ", "Trained: ").replace("  \n", "")
    assert sys.executable  # the suite's interpreter ran the CLI in-process
