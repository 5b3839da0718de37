"""The first GPU check, in one command: `make gpu-check` on a machine with an NVIDIA GPU.

    python -m scalelab.harness.gpu_check                  every part, within --deadline-s (needs CUDA)
    python -m scalelab.harness.gpu_check --only bench     some parts: suite | bench | large | fp8 | sweep | diagnose | fsdp | memory | profile | rest | stages
    python -m scalelab.harness.gpu_check --dry-run        the same steps on the CPU with tiny models
    python -m scalelab.harness.gpu_check --bundle-requirements   what `make gpu-bundle` downloads

The parts, in order of value (each gets the time the ones before it left, see --deadline-s):

1. suite: the GPU tests (`pytest -m gpu`);
2. bench: scalelab against a plain PyTorch loop (scalelab.harness.plain_loop: nanoGPT's shape,
   nothing of scalelab's code) at the ~350M GPT (24 layers, d 1024, 16 heads, seq 1024, vocab
   50304, batch 16), bf16 eager and compiled: each a world-size-1 stage-0 scalelab run and the
   plain loop of the same shape and batch, each a fresh process, alternated;
3. large: the same at 1.3B (24 x 2048), bf16 compiled: the 1.3B MFU target's point against
   what the plain loop reaches at that size;
4. fp8: scalelab's fp8 against its bf16, compiled, at the ~350M shape (the bench's bf16 run
   counts) and at 1.3B (24 layers, d 2048, 16 heads, seq 1024, batch 16): fp8/bf16 tokens/s per size;
5. sweep: a small world-size-1 sweep through the workflow into results/reference/<device>-<date>/,
   with the commit recorded (SCALELAB_GIT_COMMIT: a copied tree has no .git);
6. diagnose: what a scalelab/plain gap comes from: the plain loop with one of scalelab's
   differences at a time, bf16 compiled (compiled per block and loss instead of the whole model;
   in DDP at world size 1, as scalelab's one-rank stage 0 ran before the H100 measured it costing
   3%), each against the plain loop as a user writes it;
7. fsdp: what FSDP2 costs over one GPU, where it shards nothing: scalelab at stages 3 and 2, bf16
   compiled, each with one step traced, against its stage-0 run (tokens/s, device busy time);
8. memory: where a memory prediction misses: the GPU test's memory case (12 x 768, seq 1024, batch
   8), eager bf16 at stages 3 and 0, with the CUDA allocator's history over one step: what was live
   at its peak, by the line that allocated it, beside the measured and predicted peaks;
9. profile: one step of each side traced by torch.profiler (bf16 compiled): kernel time by class
   (matmul, attention, compiled, copies, optimizer, communication...), the busiest kernels, the time
   the device was busy; the traces kept under <out>/traces;
10. rest: fp16 and fp32 with TF32, eager and compiled, against the plain loop;
11. stages: every sharded stage (1, 2, 3, hybrid) against the plain FSDP2 loop (torchtitan's recipe), bf16 eager
    and compiled at 350M and 1.3B, with each side's device-busy share and kernel count from one traced step
    (scalelab.harness.stage_check). New, so last here: a session lent a GPU for it runs ``--only stages``.

Once every part has had its turn, the time left repeats the comparisons of parts 2, 3, 4 and 10 (a
second scalelab run, then a second plain run; bf16, then fp8), up to --rounds measurements of
each side, and each side's figure becomes the median of its rounds. Tokens/s of both sides is
from the median step time after the warm-up steps (the same steps, batch and shape); scalelab's
MFU is its run's.

The GPU targets: scalelab/plain >= 0.98, eager and compiled; 350M bf16 compiled MFU >= 0.45;
1.3B bf16 compiled MFU >= 0.55.

The deadline (--deadline-s, default 540 s: the GPU machine gives a command 10 minutes) bounds
the whole check: each process it starts gets the time that is left as its timeout, and a part or
point that would start with too little left is recorded as "not run: deadline". The summary
table comes last; every result is in <out>/gpu-check.json (written after each part, so a check
cut short keeps what it measured), with the logs beside it.

The dry run takes every step on the CPU, one round, one thread per process, and labels its
figures as CPU figures (they say nothing about a GPU): scalelab against the plain loop at a tiny
GPT (2 x 64) in bf16 eager and compiled and fp32 eager, fp8 emulated by torchao against bf16
(eager) at the tiny shape and a small one (2 x 128), a reference sweep kept under --out, and
the plain loop in DDP (eager).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import traceback
from pathlib import Path

from scalelab.harness import REPO_ROOT
from scalelab.harness.gpu_bundle import bundle_requirements
from scalelab.harness.gpu_compare import bench, fp8, large, repeat_rounds, rest
from scalelab.harness.gpu_diagnose import diagnose
from scalelab.harness.gpu_measure import _fmt, _status
from scalelab.harness.gpu_memory import memory
from scalelab.harness.gpu_points import COMPARISON_PARTS, TARGETS_TEXT
from scalelab.harness.gpu_profile import fsdp, profile
from scalelab.harness.gpu_session import Check
from scalelab.harness.gpu_tables import comparison_table, fp8_table, targets_text
from scalelab.harness.gpu_tools import gpu_suite, reference_sweep
from scalelab.harness.stage_check import stages

PARTS = {"suite": gpu_suite, "bench": bench, "large": large, "fp8": fp8, "sweep": reference_sweep, "diagnose": diagnose, "fsdp": fsdp,
         "memory": memory, "profile": profile, "rest": rest, "stages": stages}
"""The parts in order of value: each runs with the time the ones before it left. The stages part, new, comes
last in a whole check; a session lent a GPU for it runs it alone (``--only stages``)."""


def run_parts(check: Check, parts: list[str]) -> None:
    """Each part in turn, with the time the ones before it left; the JSON written after each, so a check cut
    short keeps what it measured."""
    for name in parts:
        print(f"== {name} ({max(check.left(), 0):.0f} s left)", flush=True)
        try:
            check.parts[name] = PARTS[name](check)
        except Exception as err:  # a check on a lent machine goes on to its other parts
            traceback.print_exc()
            check.parts[name] = {"status": "failed", "figures": f"{type(err).__name__}: {err}"[:300], "failed": True}
        check.write()


def restate_measuring_parts(check: Check) -> None:
    """The measuring parts' status, further rounds included."""
    record = check.record()
    for name, part in check.parts.items():
        if "points" in part:
            rows = ([r for r in record["comparisons"] if r["label"] in part["points"]] if name != "fp8"
                    else [r for r in record["fp8"] if r["shape"] in part["points"]])
            part["status"] = _status([{"status": r["status"]} for r in rows])
            part["failed"] = any("failed" in r["status"] for r in rows)


def print_results(check: Check, parts: list[str]) -> None:
    """The comparison and fp8 tables over every round, then the summary, last."""
    if any(n in check.parts for n in COMPARISON_PARTS):
        print("== scalelab against the plain loop (tokens/s from the median step; ratio = scalelab / plain)", flush=True)
        print(comparison_table(check.record()["comparisons"], check.dry_run), flush=True)
    if "fp8" in check.parts:
        print(f"== fp8 against bf16, {'eager, fp8 EMULATED' if check.dry_run else 'compiled'}", flush=True)
        print(fp8_table(check.record()["fp8"], check.dry_run), flush=True)
    print(summary(check, parts), flush=True)


def summary(check: Check, parts: list[str]) -> str:
    """What comes last: every part's status and figures, point by point (a part not selected says so)."""
    record = check.record()
    lines = [f"== summary: {check.elapsed():.0f} s of the {check.deadline_s:g} s deadline"
             + (" -- DRY RUN on the CPU: CPU figures, they say nothing about a GPU" if check.dry_run else ""),
             TARGETS_TEXT,
             f"{'part':<8} {'point':<24} {'status':<27} figures"]
    for name in PARTS:
        part = check.parts.get(name)
        if part is None:
            status = "not selected" if name not in parts else "not run"
            lines.append(f"{name:<8} {'':<24} {status:<27}")
            continue
        if name in COMPARISON_PARTS:
            for r in (c for c in record["comparisons"] if c["label"] in part.get("points", [])):
                lines.append(f"{name:<8} {r['label']:<24} {r['status']:<27} scalelab {_fmt(r['scalelab_tokens_per_s'], ',.0f')} "
                             f"plain {_fmt(r['plain_tokens_per_s'], ',.0f')} tok/s, ratio {_fmt(r['ratio'], '.3f')}, "
                             f"MFU {_fmt(r['scalelab_mfu'], '.3f')}, rounds {r['rounds'][0]}+{r['rounds'][1]}; "
                             f"{targets_text(r['targets'])}")
        elif name == "fp8":
            for r in record["fp8"]:
                lines.append(f"{name:<8} {r['shape'] + (' (emulated)' if r['fp8_emulated'] else ''):<24} {r['status']:<27} "
                             f"bf16 {_fmt(r['bf16_tokens_per_s'], ',.0f')} fp8 {_fmt(r['fp8_tokens_per_s'], ',.0f')} tok/s, "
                             f"fp8/bf16 {_fmt(r['fp8_over_bf16'], '.3f')}, bf16 MFU {_fmt(r['bf16_mfu'], '.3f')}, "
                             f"rounds {r['rounds'][0]}+{r['rounds'][1]}"
                             + (f"; {targets_text(r['targets'])}" if r["targets"] else ""))
        else:
            lines.append(f"{name:<8} {'':<24} {part['status']:<27} {part.get('figures', '')}")
    lines.append(f"results: {check.out / 'gpu-check.json'}")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m scalelab.harness.gpu_check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="every step on the CPU, tiny models")
    parser.add_argument("--only", choices=list(PARTS), action="append", help="run only these parts (repeatable)")
    parser.add_argument("--out", default=str(REPO_ROOT / "results" / "gpu-check"), help="where the JSON and logs go")
    parser.add_argument("--deadline-s", type=float, default=540.0, help="the whole check's time (default 540 s)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="at most this many rounds of each comparison, time allowing (default 2; dry run 1)")
    parser.add_argument("--bundle-requirements", action="store_true",
                        help="print the requirements `make gpu-bundle` downloads wheels for, and exit")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.bundle_requirements:
        print("\n".join(bundle_requirements()))
        return 0
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print("gpu_check: no CUDA device is visible (use --dry-run to check the CPU path)", file=sys.stderr)
        return 2
    out = Path(args.out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
          + (f"{torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else "no GPU")
          + (" -- DRY RUN on the CPU: these figures are CPU figures" if args.dry_run else "")
          + f"; deadline {args.deadline_s:g} s", flush=True)
    print(TARGETS_TEXT + (" (a dry run measures none of them)" if args.dry_run else ""), flush=True)
    parts = [name for name in PARTS if name in (args.only or PARTS)]
    with tempfile.TemporaryDirectory(prefix="scalelab-gpu-check-") as work:
        check = Check(out, args.dry_run, args.deadline_s, Path(work),
                      rounds=args.rounds if args.rounds is not None else 1 if args.dry_run else 2)
        run_parts(check, parts)
        if check.rounds > 1:
            print(f"== further rounds ({max(check.left(), 0):.0f} s left)", flush=True)
            repeat_rounds(check, parts)
        restate_measuring_parts(check)
        check.write()
        print_results(check, parts)
    return 1 if any(p.get("failed") for p in check.parts.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
