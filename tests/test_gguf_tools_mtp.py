"""gguf_tools extract-mtp / attach-mtp (gguf_tools/mtp.py).

References, independent of the code under test:
  - the golden model files themselves (tests/golden/models), whose bundled
    nextn head the extracted head must reproduce bit for bit when run as a
    draft head on the trunk alone, and which the extract -> attach round
    trip must give back (metadata, tensor names/types/shapes/bytes);
  - tests/nextn_files.py (head_parts / trunk_parts: the converter's
    --mtp-only and --no-mtp layouts, written by ds4py.gguf_writer.write_gguf,
    not by gguf_tools) for the expected head file contents and the trunk;
  - the loader (ds4py.load(trunk, draft_head=...)) for what a head computes.
Bit-identical is the right bar throughout: the same weights bytes run
through the same kernels on the same inputs (no tolerance).
"""

from __future__ import annotations

import io
import os

import nextn_files as NF
import numpy as np
import pytest

import ds4py
from ds4py import gguf
from gguf_tools import main

NAMES = ["dense-q8_0", "moe-q8_0"]
N_DRAFT = 3   # chained nextn_draft steps after the catch-up


def run(argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = main([str(a) for a in argv], out, err)
    return rc, out.getvalue(), err.getvalue()


def contents(path) -> tuple[list, list]:
    """(metadata [(key, value, types)], tensors [(name, type, shape, bytes)])
    in file order."""
    with gguf.open(str(path)) as f:
        types = f.metadata_types
        meta = [(k, v, types[k]) for k, v in f.metadata.items()]
        tens = [(t.name, t.type_name, tuple(t.shape), bytes(f.raw(t.name)))
                for t in f.tensors.values()]
    return meta, tens


def toks() -> np.ndarray:
    return np.load(os.path.join(NF.HERE, "golden", "logits", "sequences.npz"))["s100"][:40]


def outputs(path, draft_head=None) -> dict:
    """Trunk logits, head catch-up logits/hidden, and N_DRAFT chained draft
    steps (same inputs for every file)."""
    t = toks()
    with ds4py.load(str(path), draft_head=draft_head and str(draft_head), n_threads=2) as m, \
            m.new_session() as ss:
        lg, h = ss.eval(t, all_logits=True, return_hidden=True)
        lg, h = np.array(lg), np.array(h)
        hl, hh = m.nextn_eval(ss, t[1:], h[:-1], np.arange(1, len(t)))
        res = {"source": m.nextn_source, "trunk": lg, "head": np.array(hl),
               "head_hidden": np.array(hh)}
        hid, tok = h[-1], int(lg[-1].argmax())
        for j in range(N_DRAFT):
            dl, hid = m.nextn_draft(ss, tok, hid)
            res[f"draft{j}"] = np.array(dl)
            tok = int(dl.argmax())
    return res


def assert_same(a: dict, b: dict, keys) -> None:
    for k in keys:
        assert a[k].shape == b[k].shape and np.array_equal(a[k], b[k]), k


HEAD_KEYS = ["head", "head_hidden"] + [f"draft{j}" for j in range(N_DRAFT)]

_bundled: dict = {}


def bundled(name: str) -> dict:
    if name not in _bundled:
        _bundled[name] = outputs(NF.golden_path(name))
        assert _bundled[name]["source"] == "bundled"
    return _bundled[name]


@pytest.mark.parametrize("head_only", [False, True])
@pytest.mark.parametrize("name", NAMES)
def test_extract_runs_as_the_bundled_head(tmp_path, name, head_only):
    dst = tmp_path / "mtp.gguf"
    rc, out, err = run(["extract-mtp", NF.golden_path(name), dst]
                       + (["--head-only"] if head_only else []))
    assert rc == 0, err
    # the converter's layout (tests/nextn_files.py), in the golden file's order
    meta, tens = NF.head_parts(name, globals_=not head_only)
    got_meta, got_tens = contents(dst)
    assert [(k, v) for k, v, _ in got_meta] == [(k, v.value) for k, v in meta.items()]
    assert [(n, t, s, b) for n, t, s, b in got_tens] == \
        [(n, t, tuple(s), b) for n, (t, s, b) in tens.items()]
    n = NF.n_main(meta)
    assert all(NF.block(x[0]) == n for x in got_tens if x[0] not in NF.GLOBALS)
    assert head_only == (not any(x[0] in NF.GLOBALS for x in got_tens))
    # as a draft head on the trunk alone: the bundled head's results, bit for bit
    trunk = NF.trunk_file(tmp_path, name)
    got = outputs(trunk, draft_head=dst)
    assert got["source"] == "draft_head"
    assert_same(got, bundled(name), ["trunk"] + HEAD_KEYS)


@pytest.mark.parametrize("name", NAMES)
def test_extract_attach_round_trip(tmp_path, name):
    head, full = tmp_path / "mtp.gguf", tmp_path / "full.gguf"
    trunk = NF.trunk_file(tmp_path, name)
    assert run(["extract-mtp", NF.golden_path(name), head])[0] == 0
    rc, out, err = run(["attach-mtp", trunk, head, full])
    assert rc == 0, err
    want_meta, want_tens = contents(NF.golden_path(name))
    got_meta, got_tens = contents(full)
    # equal as sets (names, types, shapes, bytes; keys, values, stored types)
    assert sorted(got_tens) == sorted(want_tens)
    assert sorted(got_meta, key=lambda x: x[0]) == sorted(want_meta, key=lambda x: x[0])
    # and, for a trunk in the --no-mtp layout, in the original order too
    # (mtp.py docstring: trunk order, then the head block)
    assert [x[0] for x in got_tens] == [x[0] for x in want_tens]
    assert [x[0] for x in got_meta] == [x[0] for x in want_meta]
    got = outputs(full)
    assert got["source"] == "bundled"
    assert_same(got, bundled(name), ["trunk"] + HEAD_KEYS)


def test_attach_replace(tmp_path):
    name = "dense-q8_0"
    head, full = tmp_path / "mtp.gguf", tmp_path / "full.gguf"
    assert run(["extract-mtp", NF.golden_path(name), head])[0] == 0
    rc, out, err = run(["attach-mtp", NF.golden_path(name), head, full])
    assert rc == 2 and out == "" and not full.exists()
    assert err == (f"error: TRUNK {NF.golden_path(name)} already has a nextn (MTP) head "
                   "(blk.5); pass --replace to replace it\n")
    rc, out, err = run(["attach-mtp", NF.golden_path(name), head, full, "--replace"])
    assert rc == 0, err
    assert contents(full) == contents(NF.golden_path(name))


def test_attach_foreign_shared_tensors(tmp_path):
    """A head whose token_embd differs from the trunk's (dense-f32's head on
    the Q8_0 trunk): the attached model runs what the draft head runs; the
    head's token_embd goes in as blk.5.nextn.embed_tokens and (tied file)
    blk.5.nextn.shared_head_head (the golden blk.5 already carries its own
    nextn.shared_head_norm, so output_norm adds nothing)."""
    head, full = tmp_path / "mtp-f32.gguf", tmp_path / "full.gguf"
    trunk = NF.trunk_file(tmp_path, "dense-q8_0")
    assert run(["extract-mtp", NF.golden_path("dense-f32"), head])[0] == 0
    rc, out, err = run(["attach-mtp", trunk, head, full])
    assert rc == 0, err
    _, tens = contents(full)
    extra = {n: t for n, t, _s, _b in tens if n.startswith("blk.5.nextn.")}
    assert extra == {"blk.5.nextn.eh_proj.weight": "F32", "blk.5.nextn.enorm.weight": "F32",
                     "blk.5.nextn.hnorm.weight": "F32", "blk.5.nextn.embed_tokens.weight": "F32",
                     "blk.5.nextn.shared_head_head.weight": "F32",
                     "blk.5.nextn.shared_head_norm.weight": "F32"}
    want = outputs(trunk, draft_head=head)
    got = outputs(full)
    assert_same(got, want, ["trunk"] + HEAD_KEYS)
    assert np.abs(got["head"] - bundled("dense-q8_0")["head"]).max() > 1e-3  # F32 vs Q8_0


def test_refusals(tmp_path):
    trunk = NF.trunk_file(tmp_path, "dense-q8_0")
    dst = tmp_path / "out.gguf"
    # extract from a file without a head
    rc, out, err = run(["extract-mtp", trunk, dst])
    assert rc == 2 and not dst.exists() and err.count("\n") == 1
    assert err == (f"error: SRC {trunk} has no nextn (MTP) head "
                   "(qwen35.nextn_predict_layers is 0)\n")
    # a full model is not a head (the loader's message)
    rc, out, err = run(["attach-mtp", trunk, NF.golden_path("dense-q8_0"), dst])
    assert rc == 2 and not dst.exists() and err.count("\n") == 1
    assert err.startswith("error: draft head '") and \
        "carries tensors outside blk.5 (e.g. 'blk.0." in err and \
        err.endswith("not a standalone head\n")
    # a head for another architecture (the loader's message)
    moe_head = NF.head_file(tmp_path, "moe-q8_0")
    rc, out, err = run(["attach-mtp", trunk, moe_head, dst])
    assert rc == 2 and not dst.exists()
    assert "is a qwen35moe head (routed MoE FFN); the trunk is qwen35" in err
    # DST is an input
    head = NF.head_file(tmp_path, "dense-q8_0")
    rc, out, err = run(["attach-mtp", trunk, head, head])
    assert rc == 2 and "is an input file" in err
    rc, out, err = run(["extract-mtp", NF.golden_path("dense-q8_0"), NF.golden_path("dense-q8_0")])
    assert rc == 2 and "is an input file" in err
    # a missing SRC
    rc, out, err = run(["extract-mtp", tmp_path / "nope.gguf", dst])
    assert rc == 2 and err.startswith("error: ") and not dst.exists()
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
