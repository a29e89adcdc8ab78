"""Standard speculative (rejection) sampling, for drafters that sample.

    tokens = speculative_sample(p_rows, q_rows, drafts, rng)

Leviathan, Kalman, Matias 2023 ("Fast Inference from Transformers via
Speculative Decoding", Algorithm 1) and Chen et al. 2023: a draft x drawn
from the drafter's distribution q is accepted with probability
min(1, p(x) / q(x)), p being the target's distribution at that position; on
rejection the token is drawn from the normalised residual max(0, p - q).
Then the output token is distributed exactly as p, whatever q is (tested
with a chi-square test in tests/test_spec_sampling.py).

This is what a *stochastic* drafter needs. ds4py's own drafters propose
their argmax (a deterministic q, one-hot at the draft), where this rule
reduces to "accept with probability p(draft)" -- exactly what happens when
the target's own seeded sample is compared with the draft
(ds4py.spec.runner), which in addition keeps the output identical to the
same seed without drafting. The distributions here are the post-chain ones
(``Sampler.distribution``): rejection sampling is applied to what would be
drawn from.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["rejection_step", "speculative_sample", "residual"]


def _probs(x, name: str) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D probability vector")
    if not np.all(np.isfinite(a)) or a.min() < 0:
        raise ValueError(f"{name} must be finite and >= 0")
    s = a.sum()
    if s <= 0:
        raise ValueError(f"{name} has no mass")
    return a / s


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """normalise(max(0, p - q)); p itself when p == q (nothing to correct,
    and a rejection cannot happen then)."""
    r = np.maximum(p - q, 0.0)
    s = r.sum()
    return p if s <= 0 else r / s


def _draw(probs: np.ndarray, u: float) -> int:
    """Inverse CDF: the first index whose running sum exceeds u * total."""
    cs = np.cumsum(probs)
    i = int(np.searchsorted(cs, u * cs[-1], side="right"))
    i = min(i, probs.size - 1)
    while probs[i] == 0 and i > 0:  # rounding at the end of the CDF
        i -= 1
    return i


def rejection_step(p, q, draft: int, u_accept: float, u_resample: float) -> tuple[bool, int]:
    """One position: (accepted, token). ``draft`` must have been drawn from
    ``q``; ``u_accept`` and ``u_resample`` are independent uniforms in [0, 1)."""
    p, q = _probs(p, "p"), _probs(q, "q")
    if p.shape != q.shape:
        raise ValueError(f"p and q differ in size ({p.size} vs {q.size})")
    x = int(draft)
    if not 0 <= x < p.size:
        raise ValueError(f"draft {x} outside the vocabulary of {p.size}")
    if q[x] <= 0:
        raise ValueError(f"draft {x} has probability 0 under q: it was not drawn from q")
    if u_accept < min(1.0, p[x] / q[x]):
        return True, x
    return False, _draw(residual(p, q), u_resample)


def speculative_sample(p_rows: Sequence, q_rows: Sequence, drafts: Sequence[int],
                       rng: np.random.Generator) -> list[int]:
    """A whole round: ``drafts[i]`` drawn from ``q_rows[i]``; ``p_rows`` has
    one more row than drafts (the target's distribution after the last
    draft). Returns the accepted drafts plus one token: the residual draw at
    the first rejection, or a draw from the last target row when every draft
    was accepted -- each output token distributed as the target's."""
    k = len(drafts)
    if len(q_rows) != k or len(p_rows) != k + 1:
        raise ValueError(f"need {k} draft rows and {k + 1} target rows, got "
                         f"{len(q_rows)} and {len(p_rows)}")
    out: list[int] = []
    for i in range(k):
        ok, t = rejection_step(p_rows[i], q_rows[i], drafts[i], rng.random(), rng.random())
        out.append(t)
        if not ok:
            return out
    out.append(_draw(_probs(p_rows[k], "p"), rng.random()))
    return out


# -- the speculative round's side (ds4py.spec.runner, sampling="rejection") --

# Independent keyed uniforms per (seed, purpose, position): the draft's draw,
# the acceptance test and the residual draw at a position each get their own
# stream, none of them the target's own draw (ds4py.sampling.keyed_uniform
# with the bare seed). Each decision that commits a token uses its uniform
# once: a draft drawn in a round whose earlier rejection discarded it is
# drawn again in the next round with the same uniform, but nothing committed
# depended on the discarded draw.
SALT_DRAFT, SALT_ACCEPT, SALT_RESIDUAL = 0x5D1, 0xACC, 0x2E5


def keyed(seed: int, salt: int, position: int) -> float:
    """A uniform in [0, 1) keyed by (seed, salt, position)."""
    from ..sampling import keyed_uniform

    return keyed_uniform((int(seed) & 0xFFFFFFFF) | (salt << 32), position)


def dense(ids: np.ndarray, probs: np.ndarray, vocab: int) -> np.ndarray:
    """A sampler's (ids, probabilities) as a float64 vector over the vocabulary."""
    out = np.zeros(vocab, dtype=np.float64)
    out[np.asarray(ids, dtype=np.int64)] = probs
    return out


def draw_from(probs: np.ndarray, u: float) -> int:
    """The token drawn from ``probs`` (a vector with mass) with uniform ``u``."""
    return _draw(_probs(probs, "probs"), u)
