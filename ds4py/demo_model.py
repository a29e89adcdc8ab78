"""The small trained demo model shipped inside the package.

A 15.7 M-parameter qwen35 model (12 layers, GDN:attention 3:1, one MTP block)
trained on the CPython standard library's sources; `training/` reproduces it
end to end. It writes Python-flavoured text: a demo and a test fixture, not a
useful assistant.
"""

from __future__ import annotations

from importlib import resources

DEMO_MODEL_FILE = "demo-q8_0.gguf"


def demo_model_path() -> str | None:
    """Path of the shipped demo model, or None if this install lacks it."""
    p = resources.files("ds4py") / "models" / DEMO_MODEL_FILE
    return str(p) if p.is_file() else None
