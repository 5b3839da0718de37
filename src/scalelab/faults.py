"""`python -m scalelab.faults [drill ...]`: the fault drills and their figures, under the name
they were first run by; they live in scalelab.harness.faults."""
import sys

from scalelab.harness.faults import main

if __name__ == "__main__":
    sys.exit(main())
