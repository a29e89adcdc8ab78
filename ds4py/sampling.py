"""Token sampling: llama.cpp's sampler chain, vectorised with numpy.

The chain and its order are those of llama.cpp's ``common_sampler_init``
(common/sampling.cpp, default ``params.samplers``), the order its CLI and
server use:

    logit bias -> penalties -> top-k -> top-p -> min-p -> temperature -> draw

Note that llama.cpp adds the logit-bias sampler *before* the loop over
``params.samplers`` (whose first entry is penalties), so a bias is added
before the repetition penalty scales a logit, not after.

Each stage follows the formulas of llama.cpp's src/llama-sampler.cpp and, where
cheap, its float arithmetic too (float32 where it uses ``float``, float64
where it uses ``double``, the same accumulation order), so that on the same
logits the candidate sets, and with the same seed the drawn token, are
llama.cpp's own:

- logit bias (``llama_sampler_logit_bias_apply``): ``logit += bias``; a bias of
  ``-inf`` bans a token.
- penalties (``llama_sampler_penalties_apply``): for each token that occurs
  ``count > 0`` times in the last ``repeat_last_n`` accepted tokens,
  ``logit *= repeat_penalty`` if ``logit <= 0`` else ``logit /= repeat_penalty``,
  then ``logit -= count * frequency_penalty + presence_penalty``.
- top-k (``llama_sampler_top_k_impl``): keep the k largest logits, sorted
  descending; ``k <= 0`` is off.
- top-p (``llama_sampler_top_p_apply``): softmax over the current candidates
  (float32, max-subtracted, summed in candidate order), then, in descending
  order, keep the shortest prefix whose float32 running sum reaches p (and
  holds at least ``min_keep``); if the sum never reaches p, keep everything;
  ``p >= 1`` is off. The result is sorted.
- min-p (``llama_sampler_min_p_apply``): keep tokens with
  ``logit >= max_logit + logf(min_p)`` (i.e. ``p >= min_p * p_max``);
  ``min_p <= 0`` is off. On unsorted candidates the survivors keep token-id
  order (llama.cpp's first, unsorted path); on sorted candidates a prefix is
  kept and at least ``max(1, min_keep)`` tokens survive.
- temperature (``llama_sampler_temp_impl``): ``logit /= temperature``.
- draw (``llama_sampler_dist_apply``): ``p = expf(logit - max)`` (float32),
  summed in float64 in candidate order; one ``u`` from
  ``std::uniform_real_distribution<double>(0, 1)`` over ``std::mt19937(seed)``;
  the first candidate whose running float64 sum reaches ``u * sum`` wins.

Greedy (``temperature <= 0``): llama.cpp's temperature stage then keeps only
the first maximum; top-k/top-p/min-p never remove the maximum, so the result
is the argmax of the biased, penalised logits. ds4py returns exactly that,
without running the other stages or touching the random generator.

Ties: wherever llama.cpp sorts (``std::partial_sort``, not stable, so its
order among equal logits is unspecified), ds4py orders by logit descending,
then token id ascending. Greedy ties go to the lowest id (as llama.cpp's
``llama_sampler_greedy_apply`` on unsorted logits).

Random numbers: ``std::mt19937`` seeded with ``seed`` is the same generator
as numpy's legacy ``RandomState(seed)`` MT19937 (init_genrand), and libstdc++
and libc++ both build ``generate_canonical<double, 53>`` from two 32-bit words
as ``(w0 + w1 * 2**32) / 2**64``. So the same seed gives the same sequence of
uniforms as llama.cpp's dist sampler, one per sampled token.

Where ds4py departs from llama.cpp's arithmetic (for speed, on large sets):
``expf`` is computed as float64 ``exp`` rounded to float32 (glibc's ``expf``
is correctly rounded in all but rare cases) for sets of at most
``EXACT_MAX`` tokens, and as numpy's float32 ``exp`` (within an ulp or so of
``expf``, 6x faster than the float64 route) over larger ones; and the draw's
float64 running sum over a large set is found from float64 block sums (a
sequential float64 cumsum over 248k tokens costs ~1.8 ms). Everything else,
including the float32 running sum of top-p's softmax, is llama.cpp's
sequential arithmetic at every size. So on the same logits the candidate sets
and, with the same seed, the drawn tokens are llama.cpp's bit for bit when
the set is small (llama.cpp's default chain puts top-k 40 first), and over a
whole 248k vocabulary they differ only where a running sum lands within an
ulp-level difference of a threshold. Among equal logits the order (and so
which of two tied tokens a draw picks) can differ, see "Ties".

Positional draws (``SamplingParams(draw="position")``, for speculative
decoding and anything else that must not depend on how tokens were batched):
the chain above is unchanged; only the uniform of the final draw differs. It
is not the next number of one ``mt19937`` stream but a counter-based value
``keyed_uniform(seed, position)`` (splitmix64 finalizer over seed and the
absolute position the drawn token will occupy), so a seeded token is a
deterministic function of (seed, position, chain output) alone. The default
``draw="stream"`` keeps llama.cpp's stream (its seeded draws, bit for bit);
it is exact under speculative decoding too, because the loop draws exactly
once per committed token, in order (ds4py.spec.runner).

Input logits are never modified (they may be a view of a core-owned buffer):
bias and penalties work on a scratch copy. NaN or +inf logits raise
ValueError; so does a row in which every token is banned.

Log-probabilities (``logprobs``) are computed on the model's raw logits,
before any stage of the chain: ``log_softmax = x - max - log(sum(exp(x - max)))``
with ``exp`` in float32 and the sum accumulated in float64, the final
subtraction in float64.
"""

from __future__ import annotations

import math
import secrets
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "EXACT_MAX", "Candidates", "SamplingParams", "Sampler", "TokenLogprobs", "Mt19937",
    "apply_logit_bias", "apply_penalties", "top_k", "top_p", "min_p", "temperature", "draw",
    "top_positions", "logprobs", "keyed_uniform", "DRAW_MODES",
]

# How the final draw gets its uniform: "stream" (llama.cpp's mt19937 stream,
# one number per draw) or "position" (keyed by seed and position).
DRAW_MODES = ("stream", "position")

# Candidate sets up to this size get llama.cpp's arithmetic bit for bit
# (float64-exp-rounded expf, sequential sums); the cost there is a few
# microseconds, while the same over a 248k vocabulary would cost 2-3 ms.
EXACT_MAX = 4096

# Top-k over a long row goes through per-column maxima of a (ROWS, n // ROWS)
# view (see top_positions). 64 rows: the column-max pass is one contiguous
# sweep, and the surviving columns hold 64 * k candidates.
_ROWS = 64
_COLUMN_MIN = 32768

_F32 = np.float32
_TWO32 = 4294967296.0
_TWO64 = 18446744073709551616.0
_ONE_MINUS = math.nextafter(1.0, 0.0)


# ----------------------------------------------------------------- params --
@dataclass(frozen=True)
class SamplingParams:
    """What to sample with. Defaults are llama.cpp's ``common_params_sampling``
    (common/common.h): temp 0.80, top_k 40, top_p 0.95, min_p 0.05,
    penalty_repeat 1.0 (off), penalty_last_n 64, penalty_freq 0,
    penalty_present 0, min_keep 0 (which top-p and min-p treat as 1).

    ``temperature <= 0`` samples greedily. ``top_k <= 0``, ``top_p >= 1``,
    ``min_p <= 0``, ``repeat_penalty == 1`` and ``repeat_last_n == 0`` switch
    their stage off. ``logit_bias`` maps token id -> added logit (``-inf``
    bans). ``seed`` is a 32-bit unsigned seed; None picks one at random
    (``Sampler.seed`` reports it). Unlike llama.cpp, 0xFFFFFFFF is an
    ordinary seed here (llama.cpp reads it as "random").
    """

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    seed: int | None = None
    min_keep: int = 0
    draw: str = "stream"

    def __post_init__(self) -> None:
        def real(name: str) -> float:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)):
                raise TypeError(f"{name} must be a number, got {type(v).__name__}")
            if not math.isfinite(float(v)):
                raise ValueError(f"{name} must be finite, got {v}")
            return float(v)

        def integer(name: str) -> int:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise TypeError(f"{name} must be an integer, got {type(v).__name__}")
            return int(v)

        real("temperature")
        integer("top_k")
        if not 0.0 <= real("top_p") <= 1.0:
            raise ValueError(f"top_p must be in [0, 1], got {self.top_p}")
        if not 0.0 <= real("min_p") <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if real("repeat_penalty") <= 0.0:
            raise ValueError(f"repeat_penalty must be > 0, got {self.repeat_penalty}")
        if integer("repeat_last_n") < 0:
            raise ValueError(f"repeat_last_n must be >= 0, got {self.repeat_last_n}")
        real("presence_penalty")
        real("frequency_penalty")
        if integer("min_keep") < 0:
            raise ValueError(f"min_keep must be >= 0, got {self.min_keep}")
        if self.seed is not None:
            s = integer("seed")
            if not 0 <= s <= 0xFFFFFFFF:
                raise ValueError(f"seed must be in [0, 2**32), got {s}")
        if self.draw not in DRAW_MODES:
            raise ValueError(f"draw must be one of {DRAW_MODES}, got {self.draw!r}")
        if not isinstance(self.logit_bias, Mapping):
            raise TypeError("logit_bias must be a mapping token id -> bias")
        for tok, b in self.logit_bias.items():
            if isinstance(tok, bool) or not isinstance(tok, (int, np.integer)) or tok < 0:
                raise ValueError(f"logit_bias key must be a token id >= 0, got {tok!r}")
            if isinstance(b, bool) or not isinstance(b, (int, float, np.floating, np.integer)):
                raise TypeError(f"logit_bias[{tok}] must be a number, got {type(b).__name__}")
            if math.isnan(float(b)) or float(b) == math.inf:
                raise ValueError(f"logit_bias[{tok}] must be finite or -inf, got {b}")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def penalties_on(self) -> bool:
        # llama_sampler_penalties::is_disabled
        return self.repeat_last_n > 0 and not (
            self.repeat_penalty == 1.0 and self.frequency_penalty == 0.0
            and self.presence_penalty == 0.0)


# ------------------------------------------------------------- candidates --
class Candidates:
    """The candidate array llama.cpp's samplers pass along
    (``llama_token_data_array``): token ids, their current logits, and
    whether they are sorted by logit descending. Unsorted candidates are
    always in ascending token-id order here (every stage that filters an
    unsorted set keeps order)."""

    __slots__ = ("ids", "logits", "sorted")

    def __init__(self, ids: np.ndarray, logits: np.ndarray, sorted: bool = False):
        self.ids = ids
        self.logits = logits
        self.sorted = sorted

    @classmethod
    def full(cls, logits: np.ndarray) -> Candidates:
        x = np.ascontiguousarray(logits, dtype=_F32)
        return cls(np.arange(x.shape[0], dtype=np.int32), x, False)

    def __len__(self) -> int:
        return int(self.logits.shape[0])

    def __repr__(self) -> str:
        return f"Candidates(n={len(self)}, sorted={self.sorted})"


def _expf(x: np.ndarray) -> np.ndarray:
    """float32 exp of a float32 array. Small arrays: float64 exp rounded to
    float32, i.e. the correctly rounded value that glibc's expf returns in
    all but rare cases. Large arrays: numpy's float32 exp (faster, may
    differ from expf by an ulp)."""
    if x.shape[0] <= EXACT_MAX:
        return np.exp(x.astype(np.float64)).astype(_F32)
    return np.exp(x)


def _logf(p: float) -> np.float32:
    return _F32(math.log(float(_F32(p)))) if p > 0 else _F32(-np.inf)


# ------------------------------------------------------------------ top-k --
def top_positions(x: np.ndarray, k: int) -> np.ndarray:
    """Positions of the k largest values of the float32 row ``x``, ordered by
    value descending, then position ascending (ties go to lower positions).

    Over a long row a full argpartition costs ~0.4 ms per 248k floats, so a
    cheap exact pre-filter comes first: view the row as ROWS x C, take each
    column's maximum, and let t be the k-th largest column maximum. Those k
    columns hold k distinct elements >= t, so the k-th largest element of
    the row is >= t, and every element of the top k (ties at the k-th value
    included) lies in a column whose maximum is >= t. Only those columns
    (plus the < ROWS tail elements) are searched.
    """
    n = int(x.shape[0])
    if k <= 0:
        return np.empty(0, dtype=np.int64)
    k = min(k, n)
    cols_n = n // _ROWS
    if n >= _COLUMN_MIN and k * 8 <= cols_n:
        main = x[: _ROWS * cols_n].reshape(_ROWS, cols_n)
        colmax = main.max(axis=0)
        t = np.partition(colmax, cols_n - k)[cols_n - k]
        cols = np.flatnonzero(colmax >= t)
        pos = (np.arange(_ROWS, dtype=np.int64)[:, None] * cols_n + cols[None, :]).ravel()
        vals = main[:, cols].ravel()
        if _ROWS * cols_n < n:
            pos = np.concatenate([pos, np.arange(_ROWS * cols_n, n, dtype=np.int64)])
            vals = np.concatenate([vals, x[_ROWS * cols_n:]])
        return pos[_top_subset(vals, pos, k)]
    return _top_subset(x, None, k)


def _top_subset(vals: np.ndarray, pos: np.ndarray | None, k: int) -> np.ndarray:
    """Indices into ``vals`` of its k largest, ordered by (value desc,
    pos asc); ``pos`` None means pos = index."""
    m = int(vals.shape[0])
    if k >= m:
        return _order_desc(vals) if pos is None else _order_desc(vals, pos)
    kth = np.partition(vals, m - k)[m - k]
    above = np.flatnonzero(vals > kth)
    tied = np.flatnonzero(vals == kth)
    need = k - above.shape[0]
    if tied.shape[0] > need:
        if pos is not None:
            tied = tied[np.argsort(pos[tied], kind="stable")]
        tied = tied[:need]
    sel = np.concatenate([above, tied])
    if pos is None:
        # Equal values all lie in `above` or all in `tied`, each ascending:
        # index order within sel is position order among ties.
        return sel[_order_desc(vals[sel])]
    return sel[_order_desc(vals[sel], pos[sel])]


def _order_desc(vals: np.ndarray, keys: np.ndarray | None = None) -> np.ndarray:
    """argsort by (value desc, key asc) for float32 values (no NaN); keys
    None means key = index. The value bits are made order-preserving and
    packed above the key (< 2**32) into unique uint64 composites, so an
    unstable sort gives the tie order; with key = index, sorting the
    composites themselves and reading the index back from the low word is
    ~3x faster than argsort and ~5x faster than a stable sort or lexsort."""
    b = (vals + _F32(0)).view(np.uint32)  # + 0 turns -0.0 into +0.0: they tie
    asc = np.where(b >> 31, ~b, b | np.uint32(0x80000000))  # float order as uints
    hi = (~asc).astype(np.uint64) << np.uint64(32)
    if keys is None:
        comp = np.sort(hi | np.arange(vals.shape[0], dtype=np.uint64))
        return (comp & np.uint64(0xFFFFFFFF)).astype(np.int64)
    return np.argsort(hi | keys.astype(np.uint64))


def top_k(c: Candidates, k: int) -> Candidates:
    """llama_sampler_top_k_impl: keep the k largest, sorted descending."""
    if k <= 0 or len(c) == 0:
        return c
    k = min(k, len(c))
    if c.sorted:
        return Candidates(c.ids[:k], c.logits[:k], True)
    p = top_positions(c.logits, k)
    return Candidates(c.ids[p], c.logits[p], True)


def _sort(c: Candidates) -> Candidates:
    if c.sorted:
        return c
    order = _order_desc(c.logits)  # unsorted ids ascend: ties by id
    return Candidates(c.ids[order], c.logits[order], True)


# ------------------------------------------------------------------ top-p --
def _softmax_f32(logits: np.ndarray, is_sorted: bool) -> tuple[np.ndarray, np.float32]:
    """llama_sampler_softmax_impl without sorting, as (weights, sum): the
    float32 probabilities are weights / sum. Max-subtracted; the sum is the
    sequential float32 running sum in candidate order, as llama.cpp's."""
    m = logits[0] if is_sorted else logits.max()
    e = _expf(logits - m)
    # llama.cpp's float32 running sum, kept even over 248k tokens (0.7 ms):
    # its rounding (terms below half an ulp of the sum vanish) moves the
    # top-p cut-off by tens of tokens there, and an accurate sum would then
    # keep a different set than llama.cpp does.
    return e, np.cumsum(e, dtype=_F32)[-1]


def top_p(c: Candidates, p: float, min_keep: int = 0) -> Candidates:
    """llama_sampler_top_p_apply (see the module docstring)."""
    n = len(c)
    if p >= 1.0 or n == 0:
        return c
    pf = _F32(p)
    e, s = _softmax_f32(c.logits, c.sorted)
    if c.sorted:
        order = None
        m = n
    else:
        # llama.cpp first sorts only the top 256 when there are > 1024
        # candidates and sorts everything if their sum falls short of p; the
        # kept prefix is the same however far one sorts, so grow in steps.
        m = min(256, n) if n > 1024 else n
    while True:
        if c.sorted:
            ps = e / s
        else:
            order = top_positions(c.logits, m)
            ps = e[order] / s
        cum = np.cumsum(ps, dtype=_F32)  # float32, sequential: llama.cpp's cum_sum
        ok = cum >= pf
        if min_keep > 1:
            ok[: min_keep - 1] = False
        hit = np.flatnonzero(ok)
        if hit.shape[0]:
            last = int(hit[0]) + 1
            break
        if m >= n:
            last = n
            break
        m = min(n, m * 16)
    if order is None:
        return Candidates(c.ids[:last], c.logits[:last], True)
    keep = order[:last]
    return Candidates(c.ids[keep], c.logits[keep], True)


# ------------------------------------------------------------------ min-p --
def min_p(c: Candidates, p: float, min_keep: int = 0) -> Candidates:
    """llama_sampler_min_p_apply (see the module docstring)."""
    n = len(c)
    if p <= 0.0 or n == 0:
        return c
    lp = _logf(p)
    if not c.sorted:
        # llama.cpp starts its max at -FLT_MAX.
        mx = max(_F32(c.logits.max()), _F32(-np.finfo(_F32).max))
        keep = c.logits >= _F32(mx + lp)
        cnt = int(np.count_nonzero(keep))
        if cnt > 0 and cnt >= min_keep:
            return Candidates(c.ids[keep], c.logits[keep], False)
        c = _sort(c)
    thr = _F32(c.logits[0] + lp)
    ge = int(np.count_nonzero(c.logits >= thr))  # a prefix, since sorted
    last = min(n, max(1, ge, min_keep))
    return Candidates(c.ids[:last], c.logits[:last], True)


# ------------------------------------------------------------ temperature --
def temperature(c: Candidates, t: float) -> Candidates:
    """llama_sampler_temp_impl. ``t <= 0``: every logit but the first
    maximum (in candidate order) becomes -inf."""
    if len(c) == 0 or t == 1.0:
        return c
    if t <= 0.0:
        i = int(np.argmax(c.logits))
        x = np.full_like(c.logits, -np.inf)
        x[i] = c.logits[i]
        return Candidates(c.ids, x, c.sorted)
    return Candidates(c.ids, c.logits / _F32(t), c.sorted)


# --------------------------------------------------------- bias/penalties --
def apply_logit_bias(x: np.ndarray, ids: np.ndarray, bias: np.ndarray) -> None:
    """In place on the full-vocabulary row ``x``: ``x[id] += bias`` (float32)."""
    if ids.shape[0]:
        x[ids] = x[ids] + bias


def apply_penalties(x: np.ndarray, window: Sequence[int] | np.ndarray, repeat: float,
                    frequency: float, presence: float) -> None:
    """In place on the full-vocabulary row ``x``: llama.cpp's penalties for
    the tokens in ``window`` (the last repeat_last_n accepted tokens)."""
    w = np.asarray(window, dtype=np.int64)
    if w.shape[0] == 0:
        return
    toks, counts = np.unique(w, return_counts=True)
    v = x[toks]
    rp = _F32(repeat)
    v = np.where(v <= 0, v * rp, v / rp)
    # float(count) * freq + float(count > 0) * present, in float32.
    v = v - (counts.astype(_F32) * _F32(frequency) + _F32(presence))
    x[toks] = v


# ------------------------------------------------------------------- draw --
class Mt19937:
    """``std::mt19937(seed)`` and ``std::uniform_real_distribution<double>(0, 1)``
    on it, as libstdc++/libc++ implement them."""

    def __init__(self, seed: int):
        # RandomState(int) seeds with init_genrand, as std::mt19937(seed) does;
        # its state is then moved into a (public-API) MT19937 bit generator.
        key = np.random.RandomState(int(seed)).get_state()[1]
        self._bg = np.random.MT19937()
        self._bg.state = {"bit_generator": "MT19937", "state": {"key": key, "pos": 624}}

    def next_u32(self) -> int:
        return int(self._bg.random_raw())

    def uniform(self) -> float:
        # generate_canonical<double, 53>: two 32-bit words, low word first,
        # sum rounded once to double, scaled by 2**-64; a result that rounds
        # up to 1.0 is replaced by the largest double below 1.
        w = self._bg.random_raw(2)
        r = (float(w[0]) + float(w[1]) * _TWO32) / _TWO64
        return r if r < 1.0 else _ONE_MINUS

    def get_state(self) -> dict:
        return self._bg.state

    def set_state(self, state: dict) -> None:
        self._bg.state = state


_M64 = (1 << 64) - 1


def _mix64(z: int) -> int:
    """splitmix64's finalizer (Steele, Lea, Flood 2014, "Fast splittable
    pseudorandom number generators"): a bijection on 64-bit words whose
    output bits each depend on every input bit."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def keyed_uniform(seed: int, position: int) -> float:
    """A uniform in [0, 1) that depends only on (seed, position): 53 bits of
    two rounds of splitmix64 over the pair. Different positions of one seed
    behave as independent uniforms (what the draw needs); the same pair
    always gives the same value, on every machine (integer arithmetic)."""
    if position < 0:
        raise ValueError(f"position must be >= 0, got {position}")
    z = _mix64((int(seed) * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & _M64)
    z = _mix64((z + (int(position) + 1) * 0x9E3779B97F4A7C15) & _M64)
    return (z >> 11) * (1.0 / 9007199254740992.0)


def _draw_probs(c: Candidates) -> np.ndarray:
    """The dist sampler's unnormalised float32 weights expf(logit - max)."""
    m = c.logits[0] if c.sorted else c.logits.max()
    return _expf(c.logits - m)


def draw(c: Candidates, u: float) -> int:
    """llama_sampler_dist_apply with the uniform ``u`` in [0, 1): returns
    the token id drawn."""
    n = len(c)
    if n == 0:
        raise ValueError("no candidate tokens left to sample from")
    if n == 1:
        return int(c.ids[0])
    e = _draw_probs(c)
    if n <= EXACT_MAX:
        cs = np.cumsum(e, dtype=np.float64)  # llama.cpp: double sum_run += float p
        tgt = cs[-1] * u
        i = int(np.searchsorted(cs, tgt, side="left"))
    else:
        i = _blocked_search(e, u)
    if e[i] == 0.0:
        # Only when u == 0 exactly (llama.cpp would then return candidate 0
        # whatever its weight): take the first token that has weight.
        i = int(np.flatnonzero(e)[0])
    return int(c.ids[i])


def _blocked_search(e: np.ndarray, u: float, block: int = 4096) -> int:
    """First i with sum(e[:i+1]) >= u * sum(e), from float64 block sums and
    one in-block running sum (a full float64 cumsum of 248k costs ~1.8 ms)."""
    n = e.shape[0]
    starts = np.arange(0, n, block)
    cb = np.cumsum(np.add.reduceat(e, starts, dtype=np.float64))
    tgt = cb[-1] * u
    b = int(np.searchsorted(cb, tgt, side="left"))
    b = min(b, starts.shape[0] - 1)
    lo = int(starts[b])
    seg = e[lo: lo + block]
    cs = (cb[b - 1] if b else 0.0) + np.cumsum(seg, dtype=np.float64)
    j = min(int(np.searchsorted(cs, tgt, side="left")), seg.shape[0] - 1)
    if seg[j] == 0.0:  # rounding pushed past the block's last weighted token
        nz = np.flatnonzero(seg[: j + 1])
        if nz.shape[0]:
            j = int(nz[-1])
    return lo + j


# ---------------------------------------------------------------- sampler --
class Sampler:
    """llama.cpp's sampler chain over a fixed vocabulary size.

    ``sample(logits)`` picks a token; it does not record it. Call
    ``accept(token)`` for every token that becomes part of the sequence (the
    prompt's too, as llama.cpp's server does, if penalties should see it):
    the penalty window is the last ``repeat_last_n`` accepted tokens. With
    speculative decoding, accept only the tokens that were kept. Passing
    ``history`` to ``sample`` uses its last ``repeat_last_n`` tokens instead
    of the accepted window.

    Same params (same seed) and same logits/accept calls => same tokens.
    One Sampler per sequence: it keeps a scratch row and is not thread-safe.
    """

    def __init__(self, params: SamplingParams, vocab_size: int):
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)) \
                or vocab_size <= 0:
            raise ValueError(f"vocab_size must be a positive integer, got {vocab_size!r}")
        self.params = params
        self.vocab_size = int(vocab_size)
        bad = [t for t in params.logit_bias if t >= vocab_size]
        if bad:
            raise ValueError(f"logit_bias token id(s) {bad[:5]} outside vocabulary of "
                             f"{vocab_size}")
        items = sorted((int(t), float(b)) for t, b in params.logit_bias.items())
        self._bias_ids = np.array([t for t, _ in items], dtype=np.int64)
        self._bias_vals = np.array([b for _, b in items], dtype=_F32)
        self._ids = np.arange(self.vocab_size, dtype=np.int32)
        self._scratch = np.empty(self.vocab_size, dtype=_F32)
        self.seed = int(params.seed) if params.seed is not None else secrets.randbits(32)
        self._window: deque[int] = deque(maxlen=max(params.repeat_last_n, 1))
        self._rng = Mt19937(self.seed)

    # -- state --
    def accept(self, token: int) -> None:
        t = int(token)
        if not 0 <= t < self.vocab_size:
            raise ValueError(f"token {t} outside vocabulary of {self.vocab_size}")
        if self.params.repeat_last_n > 0:
            self._window.append(t)

    def accept_many(self, tokens: Iterable[int]) -> None:
        for t in tokens:
            self.accept(t)

    @property
    def window(self) -> tuple[int, ...]:
        """The accepted tokens the penalties currently see, oldest first."""
        return tuple(self._window) if self.params.repeat_last_n > 0 else ()

    def reset(self) -> None:
        """Back to the state right after construction (same seed)."""
        self._window.clear()
        self._rng = Mt19937(self.seed)

    def get_state(self) -> dict:
        return {"window": tuple(self._window), "rng": self._rng.get_state()}

    def set_state(self, state: dict) -> None:
        self._window.clear()
        self._window.extend(state["window"])
        self._rng.set_state(state["rng"])

    # -- sampling --
    def _prepared(self, logits: np.ndarray, history: Sequence[int] | None) -> np.ndarray:
        x = np.asarray(logits)
        if x.ndim != 1 or x.shape[0] != self.vocab_size:
            raise ValueError(f"logits must have shape ({self.vocab_size},), got {x.shape}")
        if x.dtype != _F32 or not x.flags.c_contiguous:
            x = np.ascontiguousarray(x, dtype=_F32)
        mx = x.max()
        if not mx < np.inf:  # NaN fails every comparison; np.max propagates it
            raise ValueError("logits contain NaN" if np.isnan(mx) else "logits contain +inf")
        p = self.params
        window: Sequence[int] | np.ndarray = ()
        if p.penalties_on:
            if history is None:
                window = tuple(self._window)
            else:
                h = np.asarray(history, dtype=np.int64).reshape(-1)
                window = h[max(0, h.shape[0] - p.repeat_last_n):]
                if window.shape[0] and (window.min() < 0 or window.max() >= self.vocab_size):
                    raise ValueError("history holds a token id outside the vocabulary")
        if self._bias_ids.shape[0] or len(window):
            np.copyto(self._scratch, x)
            x = self._scratch
            apply_logit_bias(x, self._bias_ids, self._bias_vals)
            apply_penalties(x, window, p.repeat_penalty, p.frequency_penalty,
                            p.presence_penalty)
            mx = x.max()
            if not mx < np.inf:
                raise ValueError("logit bias / penalties produced "
                                 + ("NaN" if np.isnan(mx) else "+inf") + " logits")
        if mx == -np.inf:
            raise ValueError("every token has logit -inf (all banned)")
        return x

    def _chain(self, x: np.ndarray) -> Candidates:
        p = self.params
        c = Candidates(self._ids, x, False)
        c = top_k(c, p.top_k)
        c = top_p(c, p.top_p, p.min_keep)
        c = min_p(c, p.min_p, p.min_keep)
        return temperature(c, p.temperature)

    def sample(self, logits: np.ndarray, history: Sequence[int] | None = None) -> int:
        """The next token id for this row of logits (float32, vocab_size)."""
        x = self._prepared(logits, history)
        if self.params.greedy:
            return int(np.argmax(x))
        c = self._chain(x)
        return draw(c, self._rng.uniform())

    def sample_at(self, logits: np.ndarray, position: int,
                  history: Sequence[int] | None = None) -> int:
        """The token for absolute ``position`` (where it will go in the
        sequence): the same chain as :meth:`sample`, drawn with
        ``keyed_uniform(seed, position)`` instead of the stream's next
        number (the stream is not advanced). A function of (seed, position,
        logits, penalty window) only."""
        x = self._prepared(logits, history)
        if self.params.greedy:
            return int(np.argmax(x))
        c = self._chain(x)
        return draw(c, keyed_uniform(self.seed, position))

    def pick(self, logits: np.ndarray, position: int) -> int:
        """The draw the params ask for (``draw="stream"``: :meth:`sample`,
        ``"position"``: :meth:`sample_at`), then :meth:`accept` of the token
        when penalties are on: the per-token step of a generation loop."""
        if self.params.draw == "position":
            t = self.sample_at(logits, position)
        else:
            t = self.sample(logits)
        if self.params.penalties_on:
            self.accept(t)
        return t

    def distribution(self, logits: np.ndarray,
                     history: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(token ids, probabilities) that ``sample`` would draw from, in
        draw order; probabilities as the dist sampler computes them (float32
        weights, float64 normalisation). Consumes no randomness."""
        x = self._prepared(logits, history)
        if self.params.greedy:
            return np.array([int(np.argmax(x))], dtype=np.int32), np.ones(1)
        c = self._chain(x)
        e = _draw_probs(c).astype(np.float64)
        return c.ids.copy(), e / e.sum()


# --------------------------------------------------------------- logprobs --
@dataclass(frozen=True)
class TokenLogprobs:
    """Raw log-softmax of the model's logits (before any sampler stage) at
    ``token``, and the ``top_n`` most likely tokens (descending, ties by
    lower id) with theirs."""

    token: int
    logprob: float
    top_ids: tuple[int, ...]
    top_logprobs: tuple[float, ...]


def logprobs(logits: np.ndarray, token: int, top_n: int = 0) -> TokenLogprobs:
    """``log_softmax(logits)[token]`` and the top_n alternatives. Stable:
    max-subtracted; exp in float32 (relative error ~1e-7 per term), sum
    accumulated in float64, final ``(x - max) - log(sum)`` in float64, so the
    result is within ~1e-6 absolute of the exact value."""
    x = np.asarray(logits)
    if x.ndim != 1 or x.shape[0] == 0:
        raise ValueError(f"logits must be a non-empty 1-D array, got shape {x.shape}")
    if x.dtype != _F32 or not x.flags.c_contiguous:
        x = np.ascontiguousarray(x, dtype=_F32)
    t = int(token)
    if not 0 <= t < x.shape[0]:
        raise ValueError(f"token {t} outside vocabulary of {x.shape[0]}")
    if top_n < 0:
        raise ValueError(f"top_n must be >= 0, got {top_n}")
    mx = x.max()
    if not mx < np.inf:
        raise ValueError("logits contain NaN" if np.isnan(mx) else "logits contain +inf")
    if mx == -np.inf:
        raise ValueError("every logit is -inf")
    m = float(mx)
    lse = math.log(float(np.sum(np.exp(x - mx), dtype=np.float64)))
    top = top_positions(x, top_n) if top_n else np.empty(0, dtype=np.int64)
    return TokenLogprobs(
        token=t,
        logprob=(float(x[t]) - m) - lse,
        top_ids=tuple(int(i) for i in top),
        top_logprobs=tuple((float(x[i]) - m) - lse for i in top),
    )
