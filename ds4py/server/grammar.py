"""Constrained decoding: token masks from llguidance.

Why llguidance (and not xgrammar): it ships as one self-contained wheel with
no dependencies (xgrammar pulls in torch and transformers), computes a mask in
microseconds with its lexer/Earley parser, takes JSON Schema and Lark
directly, and builds its token trie from any byte-level vocabulary, so the
model's own GGUF tokenizer is wrapped as it is (no Hugging Face files needed).

``GrammarCompiler(tokenizer)`` wraps the ds4py Tokenizer once per model;
``compiler.json_schema(schema)`` / ``json_object()`` / ``lark(text)`` return a
fresh :class:`GrammarConstraint` for one request. The constraint masks each
step's logits (disallowed tokens -> -inf) and consumes the chosen token; the
end-of-generation tokens are allowed exactly when the grammar accepts, so the
reply always parses. Errors in a schema raise :class:`GrammarError` before any
generation (the HTTP side answers 400).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

try:
    import llguidance
except ImportError:  # a clear 400 at request time instead of an import error at start
    llguidance = None


class GrammarError(ValueError):
    pass


class _Wrapper:
    """The minimal interface llguidance.TokenizerWrapper reads."""

    def __init__(self, tok):
        n = tok.n_vocab
        self.eos_token_id = tok.eos_id if tok.eos_id is not None else min(tok.eog_ids)
        self.bos_token_id = tok.bos_id
        self.tokens = [tok.token_bytes(i, special=True) for i in range(n)]
        self.special_token_ids = sorted(tok.special_ids)
        self._tok = tok

    def __call__(self, s):
        if isinstance(s, bytes):
            s = s.decode("utf-8", "replace")
        return self._tok.encode(s)


class GrammarCompiler:
    def __init__(self, tokenizer, vocab_size: int):
        if llguidance is None:
            raise GrammarError("structured output needs the llguidance package "
                               "(pip install llguidance)")
        w = _Wrapper(tokenizer)
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eog = sorted(tokenizer.eog_ids)
        self._ll = llguidance.LLTokenizer(llguidance.TokenizerWrapper(w),
                                          n_vocab=vocab_size, eos_token=self.eog)

    def _make(self, grammar: str) -> GrammarConstraint:
        err = llguidance.LLMatcher.validate_grammar(grammar, self._ll)
        if err:
            raise GrammarError(f"invalid grammar: {err}")
        m = llguidance.LLMatcher(self._ll, grammar, log_level=0)
        if m.is_error():
            raise GrammarError(f"invalid grammar: {m.get_error()}")
        return GrammarConstraint(m, self.vocab_size)

    def json_schema(self, schema: Any) -> GrammarConstraint:
        if not isinstance(schema, dict):
            raise GrammarError("json_schema.schema must be a JSON object")
        try:
            g = llguidance.LLMatcher.grammar_from_json_schema(
                json.dumps(schema), defaults={"whitespace_flexible": False})
        except Exception as e:  # noqa: BLE001 — llguidance reports schema errors as ValueError
            raise GrammarError(f"unsupported JSON schema: {e}") from None
        return self._make(g)

    def json_object(self) -> GrammarConstraint:
        return self.json_schema({"type": "object"})

    def lark(self, text: str) -> GrammarConstraint:
        try:
            g = llguidance.LLMatcher.grammar_from_lark(text)
        except Exception as e:  # noqa: BLE001
            raise GrammarError(f"invalid grammar: {e}") from None
        return self._make(g)


class GrammarConstraint:
    """One request's matcher. Used only on the scheduler thread."""

    def __init__(self, matcher, vocab_size: int):
        self._m = matcher
        self._vocab = vocab_size
        self._scratch = np.empty(vocab_size, dtype=np.float32)
        words = (vocab_size + 31) // 32
        self._mask = np.zeros(words, dtype=np.int32)
        self._bits = np.arange(32, dtype=np.int32)

    def allowed(self) -> np.ndarray:
        """bool[vocab]: the tokens the grammar admits next."""
        self._m.unsafe_compute_mask_ptr(self._mask.ctypes.data, self._mask.nbytes)
        bits = (self._mask[:, None] >> self._bits[None, :]) & 1
        return bits.reshape(-1)[: self._vocab].astype(bool)

    def masked(self, logits: np.ndarray) -> np.ndarray:
        ok = self.allowed()
        if not ok.any():
            raise GrammarError(f"the grammar admits no token: {self._m.get_error()}")
        out = self._scratch
        out.fill(-np.inf)
        np.copyto(out, logits, where=ok)
        return out

    def consume(self, token: int) -> None:
        if not self._m.consume_token(int(token)):
            raise GrammarError(f"token {token} rejected by the grammar: {self._m.get_error()}")

    def finished(self) -> bool:
        return self._m.is_stopped()
