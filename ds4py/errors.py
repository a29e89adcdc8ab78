"""Typed errors. Each carries the C core's message (and code where there is one)."""


class DS4Error(Exception):
    """Base class of every ds4py error."""

    def __init__(self, message: str, code: int = 0):
        super().__init__(message)
        self.code = code


class GGUFError(DS4Error, ValueError):
    """A GGUF file (or a request against one) is malformed or unsupported."""


class QuantError(DS4Error, ValueError):
    """A kernel call was given a type, length or ISA it cannot run."""


class ModelError(DS4Error, ValueError):
    """A model cannot be loaded or run correctly."""
