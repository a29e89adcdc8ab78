"""Opt-in (needs torch; `make test-reference`): the PyTorch DFlash model that
training/train_dflash.py trains (training/dflash_model.py) computes the
same block as the core's forward, and training/export_dflash.py writes it
in the layout the core binds."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: dflash_files
import torch  # noqa: E402  (a missing torch fails the opt-in run)
from dflash_files import DENSE_F32, ROOT, ref_propose  # noqa: E402

import ds4py  # noqa: E402
import ds4py.gguf as G  # noqa: E402
from ds4py.dflash import DFlashDrafter  # noqa: E402

pytestmark = pytest.mark.reference
sys.path.insert(0, os.path.join(ROOT, "training"))
from dflash_model import DFlashConfig, DFlashDraftModel, propose_logits  # noqa: E402
from export_dflash import export, model_arrays  # noqa: E402


def test_torch_model_export_and_core_agree(tmp_path):
    torch.manual_seed(0)
    cfg = DFlashConfig(n_embd=256, n_layer=2, n_head=4, n_head_kv=2, head_dim=64, n_ff=128,
                       rope_base=10000.0, block_size=8, target_layers=[0, 2, 4],
                       mask_token_id=500)
    net = DFlashDraftModel(cfg)
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(1 + 0.2 * torch.randn_like(p) if p.ndim == 1 else 0.08 * torch.randn_like(p))
    path = tmp_path / "t.gguf"
    export(net, path)
    target = ds4py.load(DENSE_F32, precision="exact", n_threads=2)
    s = ds4py.Session(target)
    _, taps = s.eval(list(range(3, 50)), all_logits=True, hidden_layers=[0, 2, 4])
    taps = np.array(taps)
    emb = np.array(G.open(DENSE_F32).array("token_embd.weight"))
    e64 = torch.tensor(emb, dtype=torch.float64)
    t_logits = propose_logits(net.double(), torch.tensor(taps, dtype=torch.float64), 77,
                              e64, e64).numpy()
    # torch float64 vs the numpy float64 reference: the same formulas twice
    n_logits = ref_propose(cfg, model_arrays(net), taps, 77, emb, emb)
    assert np.abs(t_logits - n_logits).max() < 1e-9
    d = DFlashDrafter.load(target, path)
    d.ctx.add(taps, 0)
    drafts, c_logits = d.ctx.propose(77, taps.shape[0])
    # float32 core vs float64 torch (test_dflash.py states this tolerance)
    assert np.abs(c_logits - t_logits).max() <= 2e-5 * (1 + np.abs(t_logits).max())
    assert drafts == [int(x) for x in t_logits.argmax(1)]
