"""`python -m minitensor.memory_viz snap.pickle -o memory.html`: page.py's `main`."""
import sys

from .page import main

sys.exit(main())
