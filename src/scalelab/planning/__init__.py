"""Planning a sweep, before anything runs: the axes and run points (sweep), each run's typed plan
(run_plan: micro-batch, launch plan, device, collective dtypes; what the rules, the launcher and the
ranks read), where each run's ranks go (placement), the config checked against them (validation),
and the contracts a run writes (columns, with when each is filled: null_contract; the tables built and written:
result_tables; a run's outputs held to them: column_checks). Read by the Snakefile's rules to decide the jobs."""
