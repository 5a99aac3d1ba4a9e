"""Where the tests find the repository: its root (experiments/, benchmarks/, docs/ ...) and ../shared beside it."""

import os

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED = os.path.join(os.path.dirname(REPO_ROOT), "shared")
