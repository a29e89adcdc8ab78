"""Shared test setup: the repository root on sys.path (for build_core), and
a guard that the extension module was built from the current sources."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
