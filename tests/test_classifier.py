"""The draft pairing classifier (ds4py.spec.classifier): identities, the
verdict matrix, structural refusals, and what the CLI prints on attach."""

from __future__ import annotations

import io
import json
import os
import shutil

import numpy as np
import pytest
from nextn_files import deeper_head, golden_path, head_file, resized_head, trunk_file

from ds4py import cli
from ds4py.spec.classifier import (
    VERDICT_PREFIX,
    PairingError,
    classify,
    identity,
    load_table,
)

NAMES = ["dense-q8_0", "moe-q8_0"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("pairs")
    out = {}
    for n in NAMES:
        out[n] = {"trunk": trunk_file(d, n), "head": head_file(d, n),
                  "head_min": head_file(d, n, globals_=False),
                  "narrow": resized_head(d, n, 64), "deeper": deeper_head(d, n),
                  "full": golden_path(n)}
    return out


def table(tmp_path, entries) -> str:
    p = tmp_path / "pairs.json"
    p.write_text(json.dumps({"pairs": entries}))
    return str(p)


@pytest.mark.parametrize("name", NAMES)
def test_identity_ignores_names_and_sees_types(name, files, tmp_path):
    f = files[name]
    a = identity(f["trunk"])
    # a renamed copy is the same artifact
    copy = tmp_path / "renamed-anything.gguf"
    shutil.copy(f["trunk"], copy)
    assert identity(str(copy)).id == a.id
    # the full model's trunk is the same trunk as the trunk-only file
    assert identity(f["full"]).id == a.id
    # a head is not a trunk; the two head layouts are different artifacts
    h = identity(f["head"], role="draft")
    assert h.id != a.id and h.id != identity(f["head_min"], role="draft").id
    # the type histogram is what the identity is made of
    assert sum(a.type_counts.values()) == sum(
        sum(r["types"].values()) for r in a.roles.values())
    other = NAMES[1 - NAMES.index(name)]
    assert identity(files[other]["trunk"]).id != a.id


@pytest.mark.parametrize("name", NAMES)
def test_verdict_matrix(name, files, tmp_path):
    f = files[name]
    t, h = identity(f["trunk"]).id, identity(f["head"], role="draft").id
    good = table(tmp_path, [{"target": t, "draft": h, "verdict": "ALLOW_MEASURED_GOOD"}])
    r = classify(f["trunk"], f["head"], pairs_file=good)
    assert r.verdict == "ALLOW_MEASURED_GOOD" and r.allowed
    bad = table(tmp_path, [{"target": t, "draft": h, "verdict": "REFUSE_MEASURED_BAD"}])
    for force in (False, True):  # known bad: refused even with force
        r = classify(f["trunk"], f["head"], pairs_file=bad, force=force)
        assert r.verdict == "REFUSE_MEASURED_BAD" and not r.allowed
    empty = table(tmp_path, [])
    r = classify(f["trunk"], f["head"], pairs_file=empty)
    assert r.verdict == "REFUSE_UNKNOWN" and not r.allowed
    r = classify(f["trunk"], f["head"], pairs_file=empty, force=True)
    assert r.verdict == "ALLOW_FORCED_UNKNOWN" and r.allowed
    # the target's own head: nothing to pair
    r = classify(f["full"], None, pairs_file=empty)
    assert r.verdict == "NOT_APPLICABLE" and r.allowed
    with pytest.raises(PairingError, match="no nextn head"):
        classify(f["trunk"], None, pairs_file=empty)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("force", [False, True])
def test_structural_refusals(name, force, files):
    f = files[name]
    with pytest.raises(PairingError, match="full model, not a standalone nextn head"):
        classify(f["trunk"], f["full"], force=force)
    with pytest.raises(PairingError, match=r"tensor 'blk\.\d+\.[a-z_.]+' has shape"):
        classify(f["trunk"], f["narrow"], force=force)
    with pytest.raises(PairingError, match="head of a .*-layer trunk"):
        classify(f["trunk"], f["deeper"], force=force)


def test_verdicts_belong_to_the_backend_measured(files, tmp_path):
    """A speed verdict holds on the backend it was measured on (entries
    without "backend" were measured on the CPU): elsewhere the pair is
    unmeasured -- refused, and --force-draft allows it -- with the path
    naming where it was measured. A measurement that found the output
    changed refuses the pair on every backend, force or not."""
    f = files["dense-q8_0"]
    t, h = identity(f["trunk"]).id, identity(f["head"], role="draft").id
    slow = {"target": t, "draft": h, "verdict": "REFUSE_MEASURED_BAD",
            "evidence": {"identical": True, "median_speedup": 0.93}}
    p = table(tmp_path, [slow])
    assert classify(f["trunk"], f["head"], pairs_file=p).verdict == "REFUSE_MEASURED_BAD"
    r = classify(f["trunk"], f["head"], pairs_file=p, backend="cuda")
    assert r.verdict == "REFUSE_UNKNOWN" and not r.allowed
    assert any("measured on cpu only" in x for x in r.path), r.path
    r = classify(f["trunk"], f["head"], pairs_file=p, backend="cuda", force=True)
    assert r.verdict == "ALLOW_FORCED_UNKNOWN" and r.allowed
    # measured good on cuda, bad on the cpu: each backend its own verdict
    p = table(tmp_path, [slow, {"target": t, "draft": h, "verdict": "ALLOW_MEASURED_GOOD",
                                "backend": "cuda"}])
    assert classify(f["trunk"], f["head"], pairs_file=p, backend="cuda").verdict == \
        "ALLOW_MEASURED_GOOD"
    assert classify(f["trunk"], f["head"], pairs_file=p).verdict == "REFUSE_MEASURED_BAD"
    # output changed on the cpu: refused on cuda as well, whatever force says
    p = table(tmp_path, [{**slow, "evidence": {"identical": False}}])
    for force in (False, True):
        r = classify(f["trunk"], f["head"], pairs_file=p, backend="cuda", force=force)
        assert r.verdict == "REFUSE_MEASURED_BAD" and not r.allowed
        assert any("output differed" in x for x in r.path), r.path
    bad = tmp_path / "badbackend.json"
    bad.write_text(json.dumps({"pairs": [{**slow, "backend": 3}]}))
    with pytest.raises(PairingError, match="'backend' must be a string"):
        load_table(str(bad))


def test_user_table_cannot_turn_bad_into_good(files, tmp_path, monkeypatch):
    f = files["dense-q8_0"]
    t, h = identity(f["trunk"]).id, identity(f["head"], role="draft").id
    p = table(tmp_path, [{"target": t, "draft": h, "verdict": "REFUSE_MEASURED_BAD"},
                         {"target": t, "draft": h, "verdict": "ALLOW_MEASURED_GOOD"}])
    assert load_table(p)[(t, h, "cpu")]["verdict"] == "REFUSE_MEASURED_BAD"
    bad = tmp_path / "broken.json"
    bad.write_text("{not json")
    with pytest.raises(PairingError, match="not valid JSON"):
        load_table(str(bad))
    bad.write_text(json.dumps({"pairs": [{"target": t, "draft": h, "verdict": "MAYBE"}]}))
    with pytest.raises(PairingError, match="verdict"):
        load_table(str(bad))
    # the environment names the user file
    monkeypatch.setenv("DS4PY_PAIRS", p)
    assert classify(f["trunk"], f["head"]).verdict == "REFUSE_MEASURED_BAD"


def run_cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    rc = cli.main(list(argv), out=out, err=err)
    return rc, out.getvalue(), err.getvalue()


def verdict_line(err: str) -> dict:
    lines = [ln for ln in err.splitlines() if ln.startswith(VERDICT_PREFIX)]
    assert len(lines) == 1, err
    return json.loads(lines[0][len(VERDICT_PREFIX):])


def test_cli_attach_prints_identities_and_verdict(files, tmp_path, monkeypatch):
    f = files["dense-q8_0"]
    monkeypatch.setenv("DS4PY_PAIRS", table(tmp_path, []))
    base = ("generate", "-m", f["trunk"], "--draft-head", f["head"], "-p", "Hi", "--raw",
            "--temp", "0", "--max-tokens", "8", "--json")
    rc, out, err = run_cli(*base)
    assert rc == 0
    v = verdict_line(err)
    assert v["verdict"] == "REFUSE_UNKNOWN" and not v["allowed"]
    assert "draft pairing: target" in err and "draft pairing: draft" in err
    assert "Q8_0 x" in err and "path:" in err
    refused = json.loads(out)
    assert refused["draft"]["drafting"] is False
    rc, out, err = run_cli(*base, "--force-draft", "--draft-depth", "2")
    assert rc == 0 and verdict_line(err)["verdict"] == "ALLOW_FORCED_UNKNOWN"
    forced = json.loads(out)
    assert forced["draft"]["drafting"] and forced["draft"]["drafted"] > 0
    assert forced["draft"]["verdict"] == "ALLOW_FORCED_UNKNOWN"
    assert forced["tokens"] == refused["tokens"]  # drafting never changes the output
    # a full model given as a head: refused whatever the flags, exit 2
    rc, out, err = run_cli("generate", "-m", f["trunk"], "--draft-head", f["full"], "-p", "Hi",
                           "--raw", "--max-tokens", "2", "--force-draft")
    assert rc == 2 and "not a standalone nextn head" in err and out == ""


def test_cli_no_draft_and_depth(files):
    f = files["dense-q8_0"]
    base = ("generate", "-m", f["full"], "-p", "Hi", "--raw", "--temp", "0", "--max-tokens",
            "10", "--json")
    outs = {}
    for extra in ((), ("--no-draft",), ("--draft-depth", "3")):
        rc, out, err = run_cli(*base, *extra)
        assert rc == 0, err
        outs[extra] = json.loads(out)
    assert outs[("--no-draft",)]["draft"]["drafting"] is False
    assert outs[()]["draft"]["verdict"] == "NOT_APPLICABLE"
    assert outs[("--draft-depth", "3")]["draft"]["depth_counts"].get("3", 0) > 0
    assert len({json.dumps(o["tokens"]) for o in outs.values()}) == 1
    rc, out, err = run_cli(*base, "--draft-depth", "-1")
    assert rc == 2 and "--draft-depth" in err
    assert os.path.exists(f["full"])


def test_shipped_demo_sidecar_entry_applies_to_the_demo_files(tmp_path):
    """The package table's measured entry for the demo model's trunk with its
    extracted head (spec-calibrate, ds4py/spec/pairs.json) names the
    identities those files have, so it is the verdict a user of that pair
    gets; it carries its evidence; the bundled head stays NOT_APPLICABLE."""
    import json
    from importlib import resources

    from ds4py.demo_model import demo_model_path
    from gguf_tools.mtp import extract_mtp

    head = str(tmp_path / "demo-head.gguf")
    extract_mtp(demo_model_path(), head)
    rep = classify(demo_model_path(), head)
    doc = json.loads(resources.files("ds4py.spec").joinpath("pairs.json").read_text("utf-8"))
    entries = [p for p in doc["pairs"]
               if (p["target"], p["draft"]) == (rep.target.id, rep.draft.id)]
    # measured on the CPU (loses) and on an H200 (pays): one entry each
    assert sorted(e.get("backend", "cpu") for e in entries) == ["cpu", "cuda"]
    for e in entries:
        backend = e.get("backend", "cpu")
        r = classify(demo_model_path(), head, backend=backend)
        assert r.verdict == e["verdict"] and r.entry["source"] == "package", backend
        ev = e["evidence"]
        assert ev["identical"] is True and set(ev["prompts"]) == {"code", "prose", "math", "chat"}
        assert (e["verdict"] == "ALLOW_MEASURED_GOOD") == (ev["median_speedup"] >= 1.0)
    assert rep.verdict == "REFUSE_MEASURED_BAD"  # the cpu's, the default backend
    assert classify(demo_model_path(), None).verdict == "NOT_APPLICABLE"


def test_calibrate_measures_a_pair_the_table_refuses(tmp_path, monkeypatch):
    """spec-calibrate must draft with the pair it measures even when a table
    (here the user's, via $DS4PY_PAIRS) marks it REFUSE_MEASURED_BAD --
    otherwise a bad verdict could never be re-measured (it measured serial
    against serial). The entry it writes shows drafting happened."""
    import json

    from ds4py.demo_model import demo_model_path
    from ds4py.spec.calibrate import calibrate
    from gguf_tools.mtp import extract_mtp

    head = str(tmp_path / "demo-head.gguf")
    extract_mtp(demo_model_path(), head)
    rep = classify(demo_model_path(), head)
    pairs = tmp_path / "pairs.json"
    pairs.write_text(json.dumps({"version": 1, "pairs": [
        {"target": rep.target.id, "draft": rep.draft.id, "verdict": "REFUSE_MEASURED_BAD"}]}))
    monkeypatch.setenv("DS4PY_PAIRS", str(pairs))
    assert classify(demo_model_path(), head, force=True).verdict == "REFUSE_MEASURED_BAD"
    e = calibrate(demo_model_path(), head, max_tokens=24, reps=1, n_threads=2)
    ev = e["evidence"]
    assert ev["identical"] is True
    assert all(p["tokens_per_draft_round"] > 0 for p in ev["prompts"].values()), ev["prompts"]
    # outside the measurement the table's verdict still holds
    assert classify(demo_model_path(), head, force=True).verdict == "REFUSE_MEASURED_BAD"


# ------------------------------------------------------------------ DFlash --
# DFlash drafters for the golden dense trunk (E 256, 5 trunk layers, vocab
# 512), written by tests/dflash_files.py.

def _dflash(d, name, **over):
    from dflash_files import config, random_arrays, write

    cfg = config(**over)
    return write(d / f"{name}.gguf", cfg, random_arrays(cfg))


@pytest.fixture(scope="module")
def dfl(tmp_path_factory):
    from dflash_files import config, random_arrays, write

    d = tmp_path_factory.mktemp("dflash")
    cfg = config()
    arrays = random_arrays(cfg)
    return {"f32": write(d / "f32.gguf", cfg, arrays),
            "q8": write(d / "q8.gguf", cfg, arrays, wtype="Q8_0"),
            "v0": write(d / "v0.gguf", cfg, arrays, version=0),
            "taps": _dflash(d, "taps", target_layers=[0, 1, 4]),
            "block": _dflash(d, "block", block_size=8),
            "wide": _dflash(d, "wide", n_embd=128, n_head=2),
            "deep_tap": _dflash(d, "deep", target_layers=[0, 5]),
            "mask": _dflash(d, "mask", mask_token_id=512),
            "dflash2": write(d / "v2.gguf", cfg, arrays,
                             meta_edit=lambda m: m.__setitem__("dflash.conv_kernel_size", 4)),
            "narrow_fc": write(d / "fc.gguf", cfg, arrays, tensor_edit=_fc_narrow)}


def _fc_narrow(tensors):
    # fc reading two taps' worth while the file says three
    tensors["fc.weight"] = ("F32", (512, 256), np.zeros((256, 512), np.float32))


def test_dflash_identity_is_what_the_file_is(dfl, files, tmp_path):
    ids = {k: identity(dfl[k], role="dflash") for k in ("f32", "q8", "v0", "taps", "block")}
    copy = tmp_path / "anything.gguf"
    shutil.copy(dfl["f32"], copy)
    assert identity(str(copy), role="dflash").id == ids["f32"].id  # names don't matter
    # types, taps and block size are part of what it is
    assert len({i.id for i in ids.values()} - {ids["v0"].id}) == 4
    assert ids["q8"].type_counts.get("Q8_0", 0) > 0 and "Q8_0" not in ids["f32"].type_counts
    assert ids["f32"].dims["target_layers"] == [0, 2, 4] == ids["v0"].dims["target_layers"]
    assert ids["f32"].dims["block_size"] == 6 and ids["block"].dims["block_size"] == 8
    assert ids["f32"].kind == "dflash" and ids["f32"].arch == "dflash"


def test_dflash_verdict_matrix(dfl, files, tmp_path):
    tgt = files["dense-q8_0"]["full"]
    t, dr = identity(tgt).id, identity(dfl["f32"], role="dflash").id
    good = table(tmp_path, [{"target": t, "draft": dr, "verdict": "ALLOW_MEASURED_GOOD",
                             "draft_kind": "dflash"}])
    r = classify(tgt, dflash=dfl["f32"], pairs_file=good)
    assert r.verdict == "ALLOW_MEASURED_GOOD" and r.allowed and r.draft.kind == "dflash"
    assert r.path[0] == "DFlash drafter"
    # the table names this artifact only: the Q8_0 requantization is unknown
    assert classify(tgt, dflash=dfl["q8"], pairs_file=good).verdict == "REFUSE_UNKNOWN"
    bad = table(tmp_path, [{"target": t, "draft": dr, "verdict": "REFUSE_MEASURED_BAD"}])
    for force in (False, True):
        r = classify(tgt, dflash=dfl["f32"], pairs_file=bad, force=force)
        assert r.verdict == "REFUSE_MEASURED_BAD" and not r.allowed
    empty = table(tmp_path, [])
    r = classify(tgt, dflash=dfl["f32"], pairs_file=empty)
    assert r.verdict == "REFUSE_UNKNOWN" and not r.allowed
    r = classify(tgt, dflash=dfl["f32"], pairs_file=empty, force=True)
    assert r.verdict == "ALLOW_FORCED_UNKNOWN" and r.allowed
    assert '"verdict": "ALLOW_FORCED_UNKNOWN"' in r.verdict_line()


@pytest.mark.parametrize("force", [False, True])
def test_dflash_structural_refusals(dfl, files, force):
    f = files["dense-q8_0"]
    tgt = f["full"]
    cases = [
        (f["full"], r"general.architecture is 'qwen35', a full model, not a DFlash drafter"),
        (f["head"], r"a nextn \(MTP\) head, not a DFlash drafter; pass a head with --draft-head"),
        (dfl["wide"], r"dflash.embedding_length = 128, the target's is 256"),
        (dfl["deep_tap"], r"target_layers\[1\] is trunk layer 5, outside the target's trunk"),
        (dfl["mask"], r"mask_token_id = 512 is not a token of the target"),
        (dfl["dflash2"], r"dflash.conv_kernel_size: a DFlash2 drafter"),
        (dfl["narrow_fc"], r"tensor 'fc.weight' is shape \[512, 256\], reading 3 taps of 256 "
                           r"needs \[768, 256\]"),
    ]
    for path, msg in cases:
        with pytest.raises(PairingError, match=msg):
            classify(tgt, dflash=path, force=force)
    # a DFlash drafter given as a nextn head
    with pytest.raises(PairingError, match=r"a DFlash drafter .*not a nextn head; pass it with "
                                           r"--dflash"):
        classify(f["trunk"], dfl["f32"], force=force)
    with pytest.raises(PairingError, match="both given"):
        classify(tgt, f["head"], dflash=dfl["f32"], force=force)
