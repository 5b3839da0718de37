"""What runs left behind: collection into the result tables (collect), the step-time model fitted there
(links from the bench table: link_fit; a run's collectives timed on them: comm_time; the fit: step_model)
and each run's prediction (prediction; `scalelab predict`'s check: prediction_validation), run-to-run noise
(noise, like), and the results folder's bookkeeping (status, migrate, lock, invocation)."""
