"""Runners produce records and never judge: the oracle in its venv, the in-tree implementations in process."""

from collections.abc import Callable
from typing import Any

# Applied to the in-tree model once it is loaded (a mutant's fault, a test's perturbation).
ModelHook = Callable[[Any], None]
