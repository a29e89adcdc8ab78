"""tests/reference/ holds the opt-in references: live comparisons against
llama.cpp (and later transformers) that need those packages installed. A plain
`pytest` must not collect them (the default suite runs against the committed
fixtures in tests/golden/ instead); `make test-reference` sets
DS4_REFERENCE=1 and selects `-m reference`."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)  # llamacpp_ggml, make_quant_fixtures

if os.environ.get("DS4_REFERENCE") != "1":
    collect_ignore_glob = ["test_*.py"]
