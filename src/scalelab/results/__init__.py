"""What runs left behind: collection into the result tables (collect), the step-time model fitted to the
measured runs (step_model) and each run's prediction from it (prediction; `scalelab predict`'s check:
prediction_validation), run-to-run noise (noise, like), and the results folder's bookkeeping (status, migrate,
lock, invocation)."""
