"""The harness around the library: fault drills, benchmarks, synthetic result fixtures, the
reference loop and test helpers. Nothing in the library imports it."""
