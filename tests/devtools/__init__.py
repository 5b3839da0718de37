"""The team's tools, outside the installed package: benchmarks (bench, repeatability), fault drills (faults,
drill_record, drill_audit), synthetic result sets (fixtures), a real SLURM cluster on one machine (vcluster) and the
contributing guide's layer map (layout). Importable with tests/ on the path, as pytest has it (pyproject.toml's
`pythonpath`); from the repository root: `PYTHONPATH=tests python -m devtools.<tool>`."""
