"""Planning a sweep, before anything runs: the axes and run points (sweep), where each run's
ranks go (placement), the config checked against both (validation), and the contracts a run
writes (columns, comm_table). Read by the Snakefile's rules to decide the jobs."""
