"""Standalone head sidecars (load(..., draft_head=FILE)): the structural
check comes first. A file with any blk.k for k below the trunk's depth is a
full model, not a head, and is refused as such whatever else is given
(precision, thread count, context size, a trunk with or without its own
head, a full model of the other family or depth); a head of the right kind
whose tensor has the wrong shape is refused naming that tensor."""

from __future__ import annotations

import nextn_files as NF
import pytest

import ds4py
from ds4py import ModelError

FULL = ["dense-f32", "dense-q8_0", "moe-q8_0", "moe-q4_k_m"]


@pytest.mark.parametrize("trunk_name", ["dense-q8_0", "moe-q8_0"])
@pytest.mark.parametrize("precision,n_ctx", [("fast", 0), ("exact", 64)])
def test_full_model_is_never_a_head(tmp_path, trunk_name, precision, n_ctx):
    trunks = [NF.golden_path(trunk_name), NF.trunk_file(tmp_path, trunk_name)]
    for trunk in trunks:
        for full in FULL:
            with pytest.raises(ModelError, match=r"draft head '.*': carries tensors outside "
                                                 r"blk\.\d+ \(e\.g\. 'blk\.0\..*'\); not a "
                                                 r"standalone head"):
                ds4py.load(trunk, draft_head=NF.golden_path(full), precision=precision,
                           n_threads=1, n_ctx=n_ctx or None)


@pytest.mark.parametrize("precision", ["fast", "exact"])
def test_shape_mismatch_names_the_tensor(tmp_path, precision):
    def narrow_eh(meta, t):
        k = "blk.5.nextn.eh_proj.weight"
        typ, shape, b = t[k]
        t[k] = ("F32", (shape[0], shape[1] // 2), bytes(4 * shape[0] * (shape[1] // 2)))

    head = NF.head_with(tmp_path, "dense-q8_0", "eh.gguf", narrow_eh)
    with pytest.raises(ModelError, match=r"draft head '.*': .*tensor "
                                         r"'blk\.5\.nextn\.eh_proj\.weight' has shape "
                                         r"\[512, 128\]; expected \[512, 256\]"):
        ds4py.load(NF.trunk_file(tmp_path, "dense-q8_0"), draft_head=head,
                   precision=precision, n_threads=1)
