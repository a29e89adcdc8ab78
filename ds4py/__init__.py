"""ds4py — a GGUF inference runtime for Qwen3.5-family hybrid models."""

from . import gguf, quants
from .cache import PrefixCache
from .errors import DS4Error, GGUFError, ModelError, QuantError
from .generate import Generation, GenerationChunk, generate, stream_generate
from .gguf import GGUFFile, TensorInfo
from .gguf_writer import GGUFWriter, write_gguf
from .gpu_backend import load  # noqa: E402  (Model.load, plus dflash= and backend=)
from .model import Model, ModelConfig
from .sampling import Sampler, SamplingParams
from .session import Session, Snapshot
from .stop import StopMatcher
from .tokenizer import Tokenizer, TokenizerError

__version__ = "0.1.0.dev0"

__all__ = ["DS4Error", "GGUFError", "ModelError", "QuantError", "__version__", "quants",
           "gguf", "GGUFFile", "TensorInfo", "GGUFWriter", "write_gguf", "Model", "ModelConfig",
           "load", "Session", "Snapshot", "Sampler", "SamplingParams", "StopMatcher", "Tokenizer",
           "TokenizerError", "generate", "stream_generate", "Generation", "GenerationChunk",
           "PrefixCache"]
