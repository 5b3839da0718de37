"""What runs left behind: collection into the result tables (collect, with the step-time model's
predictions made there: prediction), run-to-run noise (noise, like), and the results folder's
bookkeeping (status, migrate, lock, invocation)."""
