"""Shared by every test: this folder is importable, so helpers kept here
(``siirl_numerics``: tolerances derived from dtype and operation) load from any
sub-folder's tests, as pytest's default import mode does for a test's own folder."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
