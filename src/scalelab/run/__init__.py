"""Everything that starts processes and measures: the data step (data), the CPU peak (calibration),
the collective benchmark (commbench), the launcher and its ranks (launch, ranks, prefork), and the
worker with its model, strategies and precisions. The only layer that imports torch."""
