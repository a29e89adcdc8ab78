"""Draft pairing classifier: may this draft artifact draft for this target?

    report = classify(target_path, draft_path=None, force=False)
    report.verdict        # one of VERDICTS
    report.allowed        # drafting may run
    report.lines()        # what an attach prints (identities, counts, path, verdict line)

Fail closed and data-driven (issue 14; ds4-notes §3 "Draft pairing
classifier": a head/trunk pairing that loads fine can still draft garbage,
the tell being accepted=0 with a "matched" head).

Identity. A file is identified by what it is, never by its name: the
architecture, the dimensions that decide compatibility (embedding length,
trunk depth, vocabulary, experts), and per role (the tensor name with its
block number replaced by ``*``, e.g. ``blk.*.ffn_up_exps.weight``) the shapes
and a histogram of tensor types (routed experts all Q4_K vs a Q5_K/Q6_K
mix are different artifacts). That description, as canonical JSON, is
hashed (SHA-256, first 16 hex digits): renaming or copying a file keeps its
identity, requantizing one tensor changes it. A target is identified by its
trunk (the blocks before the head and the global tensors), a draft by its
head tensors.

Structure first (refused whatever the flags, as the core does at load, but
before anything is loaded and with the tensor named): a sidecar that
carries any ``blk.k`` with k below the target's trunk depth is a full
model, not a head; a head for another architecture or trunk depth is
refused; every head tensor's shape must fit the target (the bundled head's
tensor of the same name, else the trunk's tensors of the same role, else
the nextn shapes implied by the embedding length).

DFlash drafters (``classify(target, dflash=path)``) are identified the same
way, by what they are: architecture ``dflash``, the dimensions that decide
what they read and write (embedding length, draft layers, heads, block
size, the tapped trunk layers after the version-0 shift, the mask token),
and per role the shapes and tensor types. Their structure is checked first
too: a file that is not ``dflash`` (a nextn head or a full model given as
``--dflash``) is refused, and so is a DFlash file given as a head; an
embedding width, a tapped layer or a mask token the target does not have,
DFlash2 metadata, or an ``fc`` that does not read exactly the taps is
refused naming the key or tensor. The core's loader (csrc/dflash_load.c)
checks the rest at load.

Verdicts (a pair = (target identity, draft identity), on a backend):
  ALLOW_MEASURED_GOOD   the table says the pair was measured on this backend:
                        exact and faster
  REFUSE_MEASURED_BAD   measured to change output (on any backend), or to
                        lose speed on this backend; --force-draft does not
                        override it
  REFUSE_UNKNOWN        not measured on this backend; --force-draft overrides it
  ALLOW_FORCED_UNKNOWN  not in the table, forced
  NOT_APPLICABLE        the target's own bundled head (nothing to pair)

The table: ``pairs.json`` shipped in this package, plus a user file
(``pairs_file=``, else $DS4PY_PAIRS, else $XDG_CONFIG_HOME/ds4py/pairs.json
or ~/.config/ds4py/pairs.json) that extends it: a user entry adds pairs;
where both name a pair, a measured-bad verdict from either wins (fail
closed). Entries are what ``python -m ds4py spec-calibrate`` writes.

Backends. Whether drafting pays is a property of the pair *and of where it
runs*: the demo model's head loses 6-8% on a 2-core CPU (a verified row
costs half a plain step there) and gains 10-30% on an H200 (docs/gpu.md).
So an entry carries the backend it was measured on (``backend``: "cpu",
"cuda", ...; entries without one were measured on the CPU) and its speed
verdict holds there only: on another backend the pair is unmeasured
(REFUSE_UNKNOWN, --force-draft overrides it; the path says where it was
measured). A measurement that found the output *changed* is not about
speed: it refuses the pair on every backend.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import resources

__all__ = ["VERDICTS", "Identity", "PairingError", "PairingReport", "check_dflash", "classify",
           "identity", "load_table", "user_table_path", "VERDICT_PREFIX"]

ALLOW_MEASURED_GOOD = "ALLOW_MEASURED_GOOD"
REFUSE_MEASURED_BAD = "REFUSE_MEASURED_BAD"
REFUSE_UNKNOWN = "REFUSE_UNKNOWN"
ALLOW_FORCED_UNKNOWN = "ALLOW_FORCED_UNKNOWN"
NOT_APPLICABLE = "NOT_APPLICABLE"
VERDICTS = (ALLOW_MEASURED_GOOD, REFUSE_MEASURED_BAD, REFUSE_UNKNOWN, ALLOW_FORCED_UNKNOWN,
            NOT_APPLICABLE)
ALLOWED = frozenset({ALLOW_MEASURED_GOOD, ALLOW_FORCED_UNKNOWN, NOT_APPLICABLE})
# The machine-readable line starts with this; the rest is one JSON object.
VERDICT_PREFIX = "ds4py-draft-verdict "

_BLK = re.compile(r"^blk\.(\d+)\.(.+)$")
DFLASH_ARCH = "dflash"
# keys and tensors that make a file DFlash2 whatever its version says
# (csrc/forward/dflash.h, "file")
_DFLASH2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
_DFLASH2_TENSORS = ("attn_conv_base", "ffn_conv_base", "selector_hidden")


class PairingError(ValueError):
    """A draft artifact that cannot be a draft for this target (structure)."""


@dataclass(frozen=True)
class Identity:
    """What a trunk or a draft is: ``id`` (the hash) and what it was made of."""

    id: str
    kind: str                    # "trunk", "head" (sidecar) or "bundled-head"
    arch: str
    dims: dict
    type_counts: dict            # type name -> tensors
    roles: dict = field(repr=False)   # role -> {"shapes": [...], "types": {type: n}}

    def summary(self) -> str:
        counts = ", ".join(f"{t} x{n}" for t, n in sorted(self.type_counts.items()))
        return f"{self.id} ({self.arch} {self.kind}; {counts})"

    def to_dict(self) -> dict:
        return {"id": self.id, "kind": self.kind, "arch": self.arch, "dims": self.dims,
                "type_counts": dict(sorted(self.type_counts.items()))}


def _read(path):
    from ..gguf import open as gguf_open

    with gguf_open(path) as f:
        meta = dict(f.metadata)
        tensors = {n: (ti.type_name, tuple(int(d) for d in ti.shape))
                   for n, ti in f.tensors.items()}
    return meta, tensors


def _arch_dims(meta: dict, tensors: dict) -> tuple[str, dict]:
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise PairingError("no general.architecture in the file")
    blocks = int(meta.get(f"{arch}.block_count", 0))
    nextn = int(meta.get(f"{arch}.nextn_predict_layers", 0) or 0)
    emb = tensors.get("token_embd.weight")
    dims = {"embedding_length": int(meta.get(f"{arch}.embedding_length", 0)),
            "block_count": blocks, "nextn_predict_layers": nextn, "trunk_depth": blocks - nextn,
            "vocab": emb[1][1] if emb and len(emb[1]) > 1 else None,
            "expert_count": int(meta.get(f"{arch}.expert_count", 0) or 0)}
    return arch, dims


def _identity(kind: str, arch: str, dims: dict, tensors: dict) -> Identity:
    roles: dict[str, dict] = {}
    counts: Counter = Counter()
    for name, (tname, shape) in tensors.items():
        m = _BLK.match(name)
        role = f"blk.*.{m.group(2)}" if m else name
        r = roles.setdefault(role, {"shapes": set(), "types": Counter()})
        r["shapes"].add(shape)
        r["types"][tname] += 1
        counts[tname] += 1
    canon = {role: {"shapes": sorted(list(s) for s in r["shapes"]),
                    "types": dict(sorted(r["types"].items()))}
             for role, r in sorted(roles.items())}
    desc = {"v": 1, "kind": kind, "arch": arch, "dims": dims, "roles": canon}
    blob = json.dumps(desc, sort_keys=True, separators=(",", ":")).encode()
    return Identity(hashlib.sha256(blob).hexdigest()[:16], kind, arch, dict(dims),
                    dict(counts), canon)


def _split(tensors: dict, trunk_depth: int) -> tuple[dict, dict]:
    """(trunk tensors incl. globals, blocks at or past the trunk depth)."""
    trunk, head = {}, {}
    for name, v in tensors.items():
        m = _BLK.match(name)
        if m and int(m.group(1)) >= trunk_depth:
            head[name] = v
        else:
            trunk[name] = v
    return trunk, head


def identity(path, role: str = "target") -> Identity:
    """The identity of a target's trunk (``role="target"``), of a sidecar
    head file (``role="draft"``) or of a DFlash drafter (``role="dflash"``)."""
    meta, tensors = _read(path)
    if role == "dflash":
        if meta.get("general.architecture") != DFLASH_ARCH:
            raise PairingError(f"{os.path.basename(str(path))}: not a DFlash drafter")
        return _identity("dflash", DFLASH_ARCH, _dflash_dims(meta), tensors)
    arch, dims = _arch_dims(meta, tensors)
    trunk, head = _split(tensors, dims["trunk_depth"])
    if role == "target":
        return _identity("trunk", arch, _head_dims(dims), trunk)
    return _identity("head", arch, _head_dims(dims), tensors)


def _dflash_dims(meta: dict) -> dict:
    """The dimensions in a DFlash drafter's identity (its own; taps 0-based)."""
    def key(k, default=None):
        return meta.get(f"{DFLASH_ARCH}.{k}", default)
    version = int(key("version", 0) or 0)
    taps = [int(x) - (1 if version == 0 else 0) for x in (key("target_layers") or [])]
    return {"version": version, "embedding_length": int(key("embedding_length", 0) or 0),
            "block_count": int(key("block_count", 0) or 0),
            "block_size": int(key("block_size", 0) or 0), "target_layers": taps,
            "head_count": int(key("attention.head_count", 0) or 0),
            "head_count_kv": int(key("attention.head_count_kv", 0) or 0),
            "key_length": int(key("attention.key_length", 0) or 0),
            "feed_forward_length": int(key("feed_forward_length", 0) or 0),
            "mask_token_id": meta.get("tokenizer.ggml.mask_token_id")}


def _check_dflash(t_dims: dict, meta: dict, tensors: dict, path) -> dict:
    """Structure of a DFlash drafter for this target (refused whatever the
    flags); returns its identity dimensions."""
    name = os.path.basename(str(path))
    arch = meta.get("general.architecture")
    n = t_dims["trunk_depth"]
    if arch != DFLASH_ARCH:
        blocks = {int(m.group(1)) for tn in tensors if (m := _BLK.match(tn))}
        what = ("a full model" if any(b < n for b in blocks) else "a nextn (MTP) head"
                if blocks else "not a drafter")
        hint = "; pass a head with --draft-head (draft_head=)" if what.startswith("a nextn") \
            else ""
        raise PairingError(f"{name}: general.architecture is {arch!r}, {what}, not a DFlash "
                           f"drafter{hint}; refused")
    for k in _DFLASH2_KEYS:
        if f"{DFLASH_ARCH}.{k}" in meta:
            raise PairingError(f"{name}: has {DFLASH_ARCH}.{k}: a DFlash2 drafter, not "
                               "supported; refused")
    for tn in sorted(tensors):
        m = _BLK.match(tn)
        if m and m.group(2).split(".")[0] in _DFLASH2_TENSORS:
            raise PairingError(f"{name}: has tensor {tn!r}: a DFlash2 drafter, not supported; "
                               "refused")
    dims = _dflash_dims(meta)
    if dims["version"] > 1:
        raise PairingError(f"{name}: dflash.version = {dims['version']} is not supported "
                           "(classic DFlash is 0 or 1); refused")
    e = t_dims["embedding_length"]
    if dims["embedding_length"] != e:
        raise PairingError(f"{name}: dflash.embedding_length = {dims['embedding_length']}, the "
                           f"target's is {e}; refused")
    taps = dims["target_layers"]
    if not taps:
        raise PairingError(f"{name}: dflash.target_layers is missing or empty; refused")
    for i, t in enumerate(taps):
        if not 0 <= t < n:
            raise PairingError(f"{name}: dflash.target_layers[{i}] is trunk layer {t}, outside "
                               f"the target's trunk [0, {n}); refused")
    mask, vocab = dims["mask_token_id"], t_dims["vocab"]
    if not isinstance(mask, int) or (vocab is not None and not 0 <= mask < vocab):
        raise PairingError(f"{name}: tokenizer.ggml.mask_token_id = {mask!r} is not a token of "
                           f"the target (vocabulary {vocab}); refused")
    fc = tensors.get("fc.weight")
    want = (len(taps) * e, e)
    if fc is None or tuple(fc[1]) != want:
        got = "missing" if fc is None else f"shape {list(fc[1])}"
        raise PairingError(f"{name}: tensor 'fc.weight' is {got}, reading {len(taps)} taps of "
                           f"{e} needs {list(want)}; refused")
    return dims


def check_dflash(target_path, dflash_path) -> None:
    """Raise PairingError, naming the problem, when ``dflash_path`` is not a
    DFlash drafter this target can run (structure only; no table)."""
    t_meta, t_tensors = _read(target_path)
    _, t_dims = _arch_dims(t_meta, t_tensors)
    d_meta, d_tensors = _read(dflash_path)
    _check_dflash(t_dims, d_meta, d_tensors, dflash_path)


def _head_dims(dims: dict) -> dict:
    # the dimensions in an identity: block_count / nextn_predict_layers are
    # left out, since they differ between a full model and its trunk-only
    # or head-only files (the trunk depth they imply is kept)
    return {k: dims[k] for k in ("embedding_length", "trunk_depth", "vocab", "expert_count")}


# ------------------------------------------------------------------- table --

def user_table_path() -> str:
    env = os.environ.get("DS4PY_PAIRS")
    if env:
        return env
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "ds4py", "pairs.json")


def _parse_table(text: str, where: str) -> list[dict]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise PairingError(f"{where}: not valid JSON ({e})") from None
    pairs = doc.get("pairs") if isinstance(doc, dict) else None
    if not isinstance(pairs, list):
        raise PairingError(f"{where}: expected an object with a 'pairs' list")
    for i, p in enumerate(pairs):
        if not (isinstance(p, dict) and isinstance(p.get("target"), str)
                and isinstance(p.get("draft"), str)
                and p.get("verdict") in (ALLOW_MEASURED_GOOD, REFUSE_MEASURED_BAD)):
            raise PairingError(f"{where}: pairs[{i}] needs string 'target' and 'draft' "
                               f"identities and a verdict of {ALLOW_MEASURED_GOOD} or "
                               f"{REFUSE_MEASURED_BAD}")
        if not isinstance(p.get("backend", DEFAULT_BACKEND), str):
            raise PairingError(f"{where}: pairs[{i}] 'backend' must be a string")
    return pairs


# where an entry without a "backend" was measured (module doc "Backends")
DEFAULT_BACKEND = "cpu"


def entry_backend(entry: dict) -> str:
    return entry.get("backend", DEFAULT_BACKEND)


def changed_output(entry: dict) -> bool:
    """The measurement found drafted output different from serial: the
    pair is bad on every backend, not only where it was measured."""
    ev = entry.get("evidence")
    return isinstance(ev, dict) and ev.get("identical") is False


def load_table(pairs_file: str | None = None) -> dict[tuple[str, str, str], dict]:
    """(target id, draft id, backend) -> entry, package table merged with
    the user's."""
    table: dict[tuple[str, str], dict] = {}
    text = resources.files("ds4py.spec").joinpath("pairs.json").read_text("utf-8")
    sources = [(_parse_table(text, "ds4py/spec/pairs.json"), "package")]
    path = pairs_file if pairs_file is not None else user_table_path()
    if pairs_file is not None or os.path.exists(path):
        try:
            with open(path, encoding="utf-8") as f:
                sources.append((_parse_table(f.read(), path), path))
        except OSError as e:
            raise PairingError(f"cannot read the pairs file {path}: {e}") from None
    for pairs, src in sources:
        for p in pairs:
            key = (p["target"], p["draft"], entry_backend(p))
            old = table.get(key)
            if old is not None and old["verdict"] == REFUSE_MEASURED_BAD:
                continue  # measured bad stays bad (fail closed)
            table[key] = {**p, "source": src}
    return table


# ----------------------------------------------------------------- verdict --

@dataclass
class PairingReport:
    verdict: str
    target: Identity
    draft: Identity | None
    path: list[str]              # the decisions taken, in order
    entry: dict | None = None    # the table entry used

    @property
    def allowed(self) -> bool:
        return self.verdict in ALLOWED

    def to_dict(self) -> dict:
        return {"verdict": self.verdict, "allowed": self.allowed,
                "target": self.target.to_dict(),
                "draft": None if self.draft is None else self.draft.to_dict(),
                "path": list(self.path), "evidence": self.entry}

    def verdict_line(self) -> str:
        return VERDICT_PREFIX + json.dumps(
            {"verdict": self.verdict, "allowed": self.allowed, "target": self.target.id,
             "draft": None if self.draft is None else self.draft.id}, sort_keys=True)

    def lines(self) -> list[str]:
        out = [f"draft pairing: target {self.target.summary()}"]
        if self.draft is not None:
            out.append(f"draft pairing: draft  {self.draft.summary()}")
        out.append("draft pairing: path: " + " -> ".join(self.path))
        out.append(self.verdict_line())
        return out


def _check_structure(t_meta, t_tensors, t_arch, t_dims, d_meta, d_tensors, d_arch, d_dims,
                     draft_path) -> None:
    n = t_dims["trunk_depth"]
    name = os.path.basename(str(draft_path))
    if d_arch == DFLASH_ARCH:
        raise PairingError(f"{name}: a DFlash drafter (general.architecture = dflash), not a "
                           f"nextn head; pass it with --dflash (dflash=); refused")
    for tn in sorted(d_tensors):
        m = _BLK.match(tn)
        if m and int(m.group(1)) < n:
            raise PairingError(f"{name}: carries tensors outside blk.{n} (e.g. '{tn}'): a "
                               f"full model, not a standalone nextn head; refused")
    if d_arch != t_arch:
        raise PairingError(f"{name}: a head for architecture {d_arch!r}, the target is "
                           f"{t_arch!r}; refused")
    blocks = sorted({int(m.group(1)) for tn in d_tensors if (m := _BLK.match(tn))})
    if not blocks:
        raise PairingError(f"{name}: has no blk.{n}.* tensors: not a nextn head; refused")
    if blocks != [n]:
        raise PairingError(f"{name}: is the head of a {blocks[0]}-layer trunk "
                           f"(blk.{blocks[0]}); the target's trunk has {n} layers; refused")
    trunk, bundled = _split(t_tensors, n)
    by_role: dict[str, set] = {}
    for tn, (_t, shape) in trunk.items():
        m = _BLK.match(tn)
        if m:
            by_role.setdefault(m.group(2), set()).add(shape)
    e = t_dims["embedding_length"]
    nextn_shapes = {"nextn.eh_proj.weight": {(2 * e, e)}}
    for tn, (_t, shape) in sorted(d_tensors.items()):
        m = _BLK.match(tn)
        if tn in bundled:
            want = {bundled[tn][1]}
        elif m is None:
            want = {t_tensors[tn][1]} if tn in t_tensors else None
        elif m.group(2) in nextn_shapes:
            want = nextn_shapes[m.group(2)]
        elif m.group(2).startswith("nextn.") and len(shape) == 1:
            want = {(e,)}
        else:
            want = by_role.get(m.group(2))
        if want is not None and shape not in want:
            raise PairingError(f"{name}: tensor '{tn}' has shape {list(shape)}, the target "
                               f"needs {' or '.join(str(list(w)) for w in sorted(want))}; "
                               f"refused")


def classify(target_path, draft_path=None, *, force: bool = False,
             pairs_file: str | None = None, dflash=None,
             backend: str = DEFAULT_BACKEND) -> PairingReport:
    """The verdict for drafting on ``target_path`` with the sidecar head
    ``draft_path`` (None: the target's own bundled head), or with the DFlash
    drafter ``dflash`` (then ``draft_path`` must be None), on ``backend``
    (module doc "Backends"). Raises
    PairingError for a draft that is structurally not a head (not a DFlash
    drafter) for this target (whatever ``force`` says) or when the target
    has no head and no draft is given."""
    if dflash is not None and draft_path is not None:
        raise PairingError("a nextn head and a DFlash drafter were both given: draft with one")
    t_meta, t_tensors = _read(target_path)
    t_arch, t_dims = _arch_dims(t_meta, t_tensors)
    trunk, bundled = _split(t_tensors, t_dims["trunk_depth"])
    target = _identity("trunk", t_arch, _head_dims(t_dims), trunk)
    if dflash is not None:
        d_meta, d_tensors = _read(dflash)
        dims = _check_dflash(t_dims, d_meta, d_tensors, dflash)
        draft = _identity("dflash", DFLASH_ARCH, dims, d_tensors)
        return _lookup(target, draft, ["DFlash drafter", "structure ok", "table lookup"],
                       force, pairs_file, backend)
    if draft_path is None:
        if not bundled:
            raise PairingError(f"{os.path.basename(str(target_path))} has no nextn head and "
                               "no draft was given")
        head = _identity("bundled-head", t_arch, _head_dims(t_dims), bundled)
        return PairingReport(NOT_APPLICABLE, target, head,
                             ["bundled nextn head", "no pairing to check"])
    d_meta, d_tensors = _read(draft_path)
    d_arch, d_dims = _arch_dims(d_meta, d_tensors)
    _check_structure(t_meta, t_tensors, t_arch, t_dims, d_meta, d_tensors, d_arch, d_dims,
                     draft_path)
    draft = _identity("head", d_arch, _head_dims(d_dims), d_tensors)
    return _lookup(target, draft, ["sidecar head", "structure ok", "table lookup"], force,
                   pairs_file, backend)


_MEASURING = threading.local()


@contextmanager
def measuring():
    """While active (on this thread), a structurally sound pair is allowed
    without consulting the table: spec-calibrate measures a pair whatever a
    table says of it. Without this a pair once measured bad could never be
    re-measured -- its REFUSE_MEASURED_BAD would turn the measurement into
    serial against serial."""
    prev = getattr(_MEASURING, "on", False)
    _MEASURING.on = True
    try:
        yield
    finally:
        _MEASURING.on = prev


def _lookup(target: Identity, draft: Identity, path: list[str], force: bool,
            pairs_file: str | None, backend: str = DEFAULT_BACKEND) -> PairingReport:
    """The table's verdict for a structurally sound pair on ``backend``."""
    if getattr(_MEASURING, "on", False):
        path.append("measuring (spec-calibrate): table not consulted")
        return PairingReport(ALLOW_FORCED_UNKNOWN, target, draft, path)
    table = load_table(pairs_file)
    entry = table.get((target.id, draft.id, backend))
    if entry is not None:
        path.append(f"measured on {backend} ({entry['source']})")
        if entry["verdict"] == REFUSE_MEASURED_BAD:
            path.append("measured bad: refused" + (" (--force-draft ignored)" if force else ""))
            return PairingReport(REFUSE_MEASURED_BAD, target, draft, path, entry)
        path.append("measured good: allowed")
        return PairingReport(ALLOW_MEASURED_GOOD, target, draft, path, entry)
    elsewhere = sorted((k[2], e) for k, e in table.items() if k[:2] == (target.id, draft.id))
    for where, e in elsewhere:
        if changed_output(e):  # not a speed verdict: bad everywhere (fail closed)
            path.append(f"measured on {where} ({e['source']}): drafted output differed; "
                        "refused on every backend" + (" (--force-draft ignored)" if force else ""))
            return PairingReport(REFUSE_MEASURED_BAD, target, draft, path, e)
    if elsewhere:
        path.append(f"measured on {', '.join(w for w, _ in elsewhere)} only: a speed verdict "
                    f"that does not hold on {backend}")
    path.append("not in the table" if not elsewhere else f"unmeasured on {backend}")
    if force:
        path.append("--force-draft: allowed")
        return PairingReport(ALLOW_FORCED_UNKNOWN, target, draft, path)
    path.append("refused (measure it with spec-calibrate, or pass --force-draft)")
    return PairingReport(REFUSE_UNKNOWN, target, draft, path)
