"""Analysis: result tables, figures, the report and the planning estimates, from the Parquet
tables and the formulas alone."""
