"""The report, built from the result tables alone: tables, checks, figures, the HTML report,
compare and export."""
