"""The tokenizer of a GGUF model, built only from its ``tokenizer.ggml.*`` metadata.

    tok = Tokenizer.from_gguf("model.gguf")          # or from_gguf_metadata(f.metadata)
    ids = tok.encode("Hello <|im_end|>")              # special tokens stay plain text
    ids = tok.encode(prompt, special=True)            # ... or are recognised
    text = tok.decode(ids)
    dec = tok.stream()                                # incremental, for generation
    for i in ids: sys.stdout.write(dec.feed(i))
    sys.stdout.write(dec.finish())

Supported: byte-level BPE (``tokenizer.ggml.model`` = "gpt2") with the ``qwen35``
pre-tokenizer (qwen35-spec.md §8). Anything else is refused with a
:class:`TokenizerError` naming it: a tokenizer that splits text differently from
the one the model was trained with would run into wrong answers silently.

Encoding (byte-level BPE on the ``tokenizers`` library)
  No Unicode normalisation (llama.cpp applies none to "gpt2" vocabularies).
  The text is split by the qwen35 regex -- the tokenizer.json spelling with a
  ``(?i:...)`` contraction group, which is what the model's own tokenizer (and
  tiktoken) runs. llama.cpp spells the group out as ``'[sS]`` etc. (llama-vocab.cpp,
  LLAMA_VOCAB_PRE_TYPE_QWEN35). The two split differently only where Unicode case
  folding matches a non-ASCII letter, i.e. ``'ſ`` (U+017F folds to "s"): here
  ``'ſ`` is a contraction piece, in llama.cpp it starts a letter run; with the
  Qwen3.5 vocabulary the ids came out the same in every such string we tried.
  Each piece is mapped to GPT-2's byte alphabet and merged by the GGUF's merge
  list.

  Control, user-defined and unknown tokens (``token_type`` 3, 4, 2) are the
  "special" tokens. ``encode(text, special=True)`` splits them out of the text
  first (llama.cpp ``parse_special=true``); ``special=False`` treats their text
  like any other text. Note llama.cpp's ``parse_special=false`` still splits
  out user-defined tokens (llama-vocab.cpp, tokenizer_st_partition); we do not:
  ``special=False`` means "this text is data" (tiktoken's encode_ordinary).
  No BOS is added by ``encode``: ``add_bos`` and ``bos_id`` say whether and what
  the caller should prepend (Qwen3.5 GGUFs say add_bos_token = false).

Decoding
  Each normal token is turned back into its bytes; the bytes of the whole
  sequence are decoded as UTF-8 with invalid sequences replaced by U+FFFD (as
  tiktoken's and HF's decoders do). Control and user-defined tokens render as
  their text; ``decode(ids, special=False)`` drops control/unknown tokens (their
  text is not output), like llama.cpp's token_to_piece with special=false.
  Unused tokens (type 5, the converter's "[PAD<i>]" fillers) render as nothing,
  as in llama.cpp.

Incremental decoding
  :meth:`Tokenizer.stream` returns an :class:`IncrementalDecoder`: ``feed(id)``
  returns the text that is complete so far (never half a UTF-8 character: the
  bytes of an unfinished character are held back), ``finish()`` flushes. The
  concatenation of every piece equals ``decode`` of all the ids.

Thread safety
  ``encode`` is serialised by a lock (``special=False`` flips the underlying
  tokenizer's ``encode_special_tokens`` switch for the call). Decoders are
  per-stream objects.
"""

from __future__ import annotations

import codecs
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .errors import ModelError

__all__ = ["Tokenizer", "IncrementalDecoder", "TokenizerError", "TokenType", "QWEN35_PATTERN"]


class TokenizerError(ModelError):
    """The GGUF's tokenizer metadata is missing, malformed or of a kind we do not run."""


class TokenType:
    """``tokenizer.ggml.token_type`` values (gguf-py constants.py TokenType; llama.h
    llama_token_type)."""

    UNDEFINED = 0
    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


# The qwen35 split regex, tokenizer.json spelling (qwen35-spec.md §8; llama-vocab.cpp
# LLAMA_VOCAB_PRE_TYPE_QWEN35 quotes it as "original regex from tokenizer.json").
QWEN35_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# (tokenizer.ggml.model, tokenizer.ggml.pre) -> split regex. Fail closed: a later
# change may add pre-tokenizers, each with its own agreement tests.
_SUPPORTED = {("gpt2", "qwen35"): QWEN35_PATTERN}

_SPECIAL_TYPES = (TokenType.CONTROL, TokenType.USER_DEFINED, TokenType.UNKNOWN)
_KNOWN_TYPES = frozenset((TokenType.NORMAL, TokenType.UNKNOWN, TokenType.CONTROL,
                          TokenType.USER_DEFINED, TokenType.UNUSED))

# Token texts that end generation, from llama-vocab.cpp (llama_vocab::impl::load, the
# "maintain a list of tokens that cause end-of-generation" loop), plus the FIM
# pad/repo/file-separator tokens it adds to the same set (found by text in the
# "auto-detect special tokens by text" loop above it). Only ids whose token is
# one of these texts are EOG, besides eos/eot/eom ids from the metadata.
_EOG_TEXTS = frozenset((
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
    "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>",
    "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>",
    "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[",
    # FIM pad / repo / separator (Qwen spellings and the others llama.cpp lists)
    "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]",
    "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>",
    "<|file_sep|>", "<fim-sep>", "<fim_sep>", "<file_sep>",
))


def _byte_alphabet() -> list[str]:
    """GPT-2's byte -> printable character table (bytes_to_unicode in GPT-2's
    encoder.py; the same table llama.cpp's unicode.cpp unicode_byte_to_utf8_map builds):
    printable Latin-1 bytes map to themselves, the other 68 to U+0100 upwards in
    byte order."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = [""] * 256
    for b in keep:
        table[b] = chr(b)
    n = 0
    for b in range(256):
        if not table[b]:
            table[b] = chr(256 + n)
            n += 1
    return table


BYTE_ALPHABET = _byte_alphabet()
# character -> byte, as a str.translate table into latin-1 code points
_UNBYTE = {ord(c): b for b, c in enumerate(BYTE_ALPHABET)}


def _need(metadata: Mapping[str, Any], key: str) -> Any:
    if key not in metadata:
        raise TokenizerError(f"tokenizer: GGUF metadata has no {key}")
    return metadata[key]


def _opt_id(metadata: Mapping[str, Any], key: str, n_vocab: int) -> int | None:
    v = metadata.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise TokenizerError(f"tokenizer: {key} is {v!r}, not an integer token id")
    # llama-vocab.cpp ignores an out-of-range special id (with a warning); an id that
    # names no token cannot be meant, so refuse it instead.
    if not 0 <= v < n_vocab:
        raise TokenizerError(f"tokenizer: {key} = {v} is outside the vocabulary (0..{n_vocab - 1})")
    return v


class Tokenizer:
    """A GGUF model's tokenizer. Build it with :meth:`from_gguf_metadata` or
    :meth:`from_gguf`; see the module docstring for the exact semantics."""

    def __init__(self, *, tokens: Sequence[str], token_types: Sequence[int],
                 merges: Sequence[str], pattern: str, bos_id: int | None, eos_id: int | None,
                 pad_id: int | None, eot_id: int | None, eom_id: int | None, add_bos: bool,
                 chat_template: str | None, model: str, pre: str):
        from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
        from tokenizers import Tokenizer as _HFTokenizer

        self._tokens = list(tokens)
        self._types = list(token_types)
        self.bos_id, self.eos_id, self.pad_id = bos_id, eos_id, pad_id
        self.eot_id, self.eom_id = eot_id, eom_id
        self.add_bos = add_bos
        self.chat_template = chat_template
        self.model_name, self.pre = model, pre

        vocab: dict[str, int] = {}
        for i, t in enumerate(self._tokens):
            if t in vocab:
                # llama.cpp's token_to_id map silently keeps the last one; two ids with
                # one text make text -> id ambiguous, so refuse.
                raise TokenizerError(
                    f"tokenizer: token {t!r} appears twice (ids {vocab[t]} and {i})")
            vocab[t] = i
        self._vocab = vocab

        pairs = []
        for k, m in enumerate(merges):
            parts = m.split(" ")
            if len(parts) != 2 or not parts[0] or not parts[1]:
                raise TokenizerError(f"tokenizer: merge {k} is {m!r}, not two tokens "
                                     "separated by one space")
            a, b = parts
            if a not in vocab or b not in vocab or a + b not in vocab:
                missing = next(x for x in (a, b, a + b) if x not in vocab)
                raise TokenizerError(f"tokenizer: merge {k} ({m!r}) names {missing!r}, "
                                     "which is not in the vocabulary")
            pairs.append((a, b))
        for c in BYTE_ALPHABET:
            # Every byte must have a token, or some text could not be encoded at all.
            if c not in vocab:
                raise TokenizerError(
                    f"tokenizer: byte 0x{BYTE_ALPHABET.index(c):02x} ({c!r}) has no token; "
                    "a byte-level BPE vocabulary needs all 256")

        try:
            bpe = models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False,
                             ignore_merges=False)
        except Exception as e:  # the library's own consistency checks
            raise TokenizerError(f"tokenizer: the BPE model cannot be built: {e}") from e
        hf = _HFTokenizer(bpe)
        # No normalizer (llama.cpp applies none for "gpt2" vocabularies).
        hf.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
        hf.decoder = decoders.ByteLevel()
        specials = [i for i, ty in enumerate(self._types) if ty in _SPECIAL_TYPES]
        hf.add_special_tokens([
            AddedToken(self._tokens[i], special=True, normalized=False, lstrip=False,
                       rstrip=False, single_word=False)
            for i in specials
        ])
        for i in specials:
            got = hf.token_to_id(self._tokens[i])
            if got != i:  # an added token must keep its GGUF id
                raise TokenizerError(f"tokenizer: special token {self._tokens[i]!r} (id {i}) "
                                     f"was given id {got}")
        self._hf = hf
        self._lock = threading.Lock()
        self._special_ids = frozenset(specials)
        self._pieces: list[bytes] | None = None
        self._pieces_plain: list[bytes] | None = None
        self._chat = None

    # -- construction -----------------------------------------------------------------

    @classmethod
    def from_gguf_metadata(cls, metadata: Mapping[str, Any]) -> Tokenizer:
        """Build from a GGUF's metadata dict (as ``ds4py.gguf.open(path).metadata``
        returns it). Raises :class:`TokenizerError` naming what is missing, malformed
        or unsupported."""
        model = _need(metadata, "tokenizer.ggml.model")
        pre = metadata.get("tokenizer.ggml.pre", "default")
        if (model, pre) not in _SUPPORTED:
            supported = ", ".join(f"model={m!r} pre={p!r}" for m, p in _SUPPORTED)
            raise TokenizerError(
                f"tokenizer: tokenizer.ggml.model = {model!r} with tokenizer.ggml.pre = {pre!r} "
                f"is not supported (supported: {supported})")
        tokens = _need(metadata, "tokenizer.ggml.tokens")
        if not isinstance(tokens, list) or not tokens:
            raise TokenizerError("tokenizer: tokenizer.ggml.tokens is not a non-empty array")
        for i, t in enumerate(tokens):
            if not isinstance(t, str):
                raise TokenizerError(f"tokenizer: token {i} is {type(t).__name__} {t!r}, "
                                     "not UTF-8 text")
            if not t:
                raise TokenizerError(f"tokenizer: token {i} is empty")
        n = len(tokens)
        types = metadata.get("tokenizer.ggml.token_type")
        if types is None:
            types = [TokenType.NORMAL] * n  # llama-vocab.cpp: no types -> all normal
        if not isinstance(types, list) or len(types) != n:
            raise TokenizerError(
                f"tokenizer: tokenizer.ggml.token_type has "
                f"{len(types) if isinstance(types, list) else type(types).__name__} entries, "
                f"tokenizer.ggml.tokens has {n}")
        for i, ty in enumerate(types):
            if ty not in _KNOWN_TYPES:
                raise TokenizerError(
                    f"tokenizer: token {i} ({tokens[i]!r}) has token_type {ty}, which a "
                    "byte-level BPE vocabulary does not use (expected 1-5)")
        merges = _need(metadata, "tokenizer.ggml.merges")
        if not isinstance(merges, list) or not all(isinstance(m, str) for m in merges):
            raise TokenizerError("tokenizer: tokenizer.ggml.merges is not an array of strings")
        add_bos = metadata.get("tokenizer.ggml.add_bos_token", False)
        if not isinstance(add_bos, bool):
            raise TokenizerError(f"tokenizer: tokenizer.ggml.add_bos_token is {add_bos!r}")
        bos = _opt_id(metadata, "tokenizer.ggml.bos_token_id", n)
        if add_bos and bos is None:
            raise TokenizerError("tokenizer: add_bos_token is true but there is no bos_token_id")
        template = metadata.get("tokenizer.chat_template")
        if template is not None and not isinstance(template, str):
            raise TokenizerError("tokenizer: tokenizer.chat_template is not UTF-8 text")
        return cls(
            tokens=tokens, token_types=types, merges=merges, pattern=_SUPPORTED[(model, pre)],
            bos_id=bos, eos_id=_opt_id(metadata, "tokenizer.ggml.eos_token_id", n),
            pad_id=_opt_id(metadata, "tokenizer.ggml.padding_token_id", n),
            eot_id=_opt_id(metadata, "tokenizer.ggml.eot_token_id", n),
            eom_id=_opt_id(metadata, "tokenizer.ggml.eom_token_id", n),
            add_bos=add_bos, chat_template=template, model=model, pre=pre)

    @classmethod
    def from_gguf(cls, path: str | os.PathLike) -> Tokenizer:
        """Open a GGUF file and build its tokenizer."""
        from . import gguf

        with gguf.open(path) as f:
            md = {k: v for k, v in f.metadata.items() if k.startswith("tokenizer.")}
        return cls.from_gguf_metadata(md)

    # -- vocabulary -------------------------------------------------------------------

    @property
    def n_vocab(self) -> int:
        return len(self._tokens)

    def __len__(self) -> int:
        return len(self._tokens)

    def token_text(self, token_id: int) -> str:
        """The token's text as stored in the GGUF (byte-alphabet form for normal tokens)."""
        return self._tokens[token_id]

    def token_type(self, token_id: int) -> int:
        return self._types[token_id]

    def token_id(self, text: str) -> int | None:
        """The id whose stored text is ``text`` (e.g. "<|im_end|>"), or None."""
        return self._vocab.get(text)

    def is_special(self, token_id: int) -> bool:
        """Control, user-defined or unknown token (recognised by ``encode(special=True)``)."""
        return token_id in self._special_ids

    @property
    def special_ids(self) -> frozenset[int]:
        return self._special_ids

    @property
    def eog_ids(self) -> frozenset[int]:
        """Ids that end generation, chosen as llama.cpp chooses them (llama-vocab.cpp:
        eos/eot/eom ids plus the tokens whose text is in its end-of-generation list)."""
        ids = {i for i in (self.eos_id, self.eot_id, self.eom_id) if i is not None}
        ids.update(self._vocab[t] for t in _EOG_TEXTS if t in self._vocab)
        return frozenset(ids)

    # -- encode -----------------------------------------------------------------------

    def encode(self, text: str, special: bool = False) -> list[int]:
        """Token ids of ``text``. ``special=True`` recognises the text of control and
        user-defined tokens (e.g. "<|im_start|>") as those tokens; otherwise that
        text is encoded like any other. Adds no BOS (see ``add_bos``)."""
        if not isinstance(text, str):
            raise TypeError(f"encode() takes str, not {type(text).__name__}")
        with self._lock:
            self._hf.encode_special_tokens = not special
            enc = self._hf.encode(text, add_special_tokens=False)
        return enc.ids

    def encode_batch(self, texts: Iterable[str], special: bool = False) -> list[list[int]]:
        texts = list(texts)
        with self._lock:
            self._hf.encode_special_tokens = not special
            encs = self._hf.encode_batch(texts, add_special_tokens=False)
        return [e.ids for e in encs]

    # -- decode -----------------------------------------------------------------------

    def _piece_table(self, special: bool) -> list[bytes]:
        table = self._pieces if special else self._pieces_plain
        if table is not None:
            return table
        pieces = []
        for t, ty in zip(self._tokens, self._types, strict=True):
            if ty == TokenType.NORMAL:
                # Every character of a normal token is in the byte alphabet (checked
                # lazily here: a stray character cannot be turned back into a byte).
                s = t.translate(_UNBYTE)
                try:
                    pieces.append(s.encode("latin-1"))
                except UnicodeEncodeError:
                    # llama.cpp's llama_decode_text keeps such characters as their UTF-8.
                    pieces.append(b"".join(
                        bytes([_UNBYTE[ord(c)]]) if ord(c) in _UNBYTE else c.encode()
                        for c in t))
            elif ty == TokenType.USER_DEFINED:
                pieces.append(t.encode("utf-8"))
            elif ty in (TokenType.CONTROL, TokenType.UNKNOWN):
                pieces.append(t.encode("utf-8") if special else b"")
            else:  # UNUSED
                pieces.append(b"")
        if special:
            self._pieces = pieces
        else:
            self._pieces_plain = pieces
        return pieces

    def token_bytes(self, token_id: int, special: bool = True) -> bytes:
        """The bytes this token contributes to decoded output."""
        return self._piece_table(special)[token_id]

    def decode_bytes(self, ids: Iterable[int], special: bool = True) -> bytes:
        table = self._piece_table(special)
        n = len(table)
        out = []
        for i in ids:
            if not 0 <= i < n:
                raise ValueError(f"token id {i} is outside the vocabulary (0..{n - 1})")
            out.append(table[i])
        return b"".join(out)

    def decode(self, ids: Iterable[int], special: bool = True) -> str:
        """Text of ``ids``; invalid UTF-8 becomes U+FFFD. ``special=False`` leaves out
        control tokens' text."""
        return self.decode_bytes(ids, special).decode("utf-8", errors="replace")

    def stream(self, special: bool = True) -> IncrementalDecoder:
        """An :class:`IncrementalDecoder` over this vocabulary."""
        return IncrementalDecoder(self, special=special)

    # -- chat -------------------------------------------------------------------------

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], tools=None,
                            enable_thinking: bool = True, add_generation_prompt: bool = True,
                            **extra: Any) -> str:
        """Render the GGUF's ``tokenizer.chat_template`` (see :mod:`ds4py.chat`)."""
        if self._chat is None:
            from .chat import ChatTemplate

            if self.chat_template is None:
                from .chat import ChatTemplateError

                raise ChatTemplateError("the model's GGUF has no tokenizer.chat_template")
            self._chat = ChatTemplate(
                self.chat_template,
                bos_token=self._tokens[self.bos_id] if self.bos_id is not None else None,
                eos_token=self._tokens[self.eos_id] if self.eos_id is not None else None)
        return self._chat.render(messages, tools=tools, enable_thinking=enable_thinking,
                                 add_generation_prompt=add_generation_prompt, **extra)


class IncrementalDecoder:
    """Turns a stream of token ids into text pieces that never end inside a UTF-8
    character. ``"".join(pieces) + finish()`` equals ``tokenizer.decode(ids)``:
    Python's incremental UTF-8 decoder with ``errors="replace"`` holds back an
    unfinished character and replaces an invalid sequence exactly as a one-shot
    decode of the same bytes does."""

    def __init__(self, tokenizer: Tokenizer, special: bool = True):
        self._table = tokenizer._piece_table(special)
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token_id: int) -> str:
        """Text completed by this token ("" while a character is still unfinished)."""
        if not 0 <= token_id < len(self._table):
            raise ValueError(f"token id {token_id} is outside the vocabulary")
        return self._dec.decode(self._table[token_id])

    def feed_many(self, ids: Iterable[int]) -> str:
        return self._dec.decode(b"".join(self._table[i] for i in ids))

    @property
    def pending(self) -> bytes:
        """Bytes held back (the start of an unfinished character)."""
        return self._dec.getstate()[0]

    def finish(self) -> str:
        """Flush: held-back bytes of an unfinished character become U+FFFD."""
        out = self._dec.decode(b"", final=True)
        self._dec.reset()
        return out
