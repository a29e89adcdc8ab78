"""The prompts the DFlash drafter is distilled on (train_dflash.py --prompts):
random 64-token corpus windows whose continuations the target generates on
the device machine. Only the prompts travel (the device call's upload limit);
the ~5.7 M generated tokens are made there.

    python training/dflash_prompts.py training/data training/carry/prompts.npz

12800 train prompts (6400 windows of 128 tokens, each split in two) and 96
held-out prompts (the first 64 tokens of 96 held-out windows), seed 0.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

WINDOW = 128


def make(data_dir: str | Path, out: str | Path, n_train: int = 6400, n_held: int = 96) -> None:
    rng = np.random.default_rng(0)
    data_dir = Path(data_dir)

    def pick(a: np.ndarray, n: int) -> np.ndarray:
        starts = rng.choice(a.size - WINDOW, n, replace=False)
        return np.stack([a[s:s + WINDOW] for s in starts])

    train = pick(np.fromfile(data_dir / "train.bin", dtype=np.uint16), n_train)
    held = pick(np.fromfile(data_dir / "heldout.bin", dtype=np.uint16), n_held)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp.npz")
    np.savez_compressed(tmp, train=train.reshape(-1, WINDOW // 2), heldout=held[:, :WINDOW // 2])
    os.replace(tmp, out)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python training/dflash_prompts.py DATA_DIR OUT.npz")
    make(sys.argv[1], sys.argv[2])
