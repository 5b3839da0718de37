"""The formulas: memory, FLOPs and bytes per step of a point (accounting), the bytes per link
(links), and a run's predicted columns (predicted_columns). Planning, the worker, collection and
the report all read them; none of them measures anything."""
