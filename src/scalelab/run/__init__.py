"""Everything that starts processes and measures: the data step (data), the CPU peak (calibration),
the collective benchmark (commbench), the launcher and its ranks (launch, ranks, prefork), and the
worker (worker: a rank's loop; rank_setup: before its first step; worker_result: rank 0's results;
fault_injection: the drills' faults) with its model, strategies and precisions. The only layer that imports torch."""
