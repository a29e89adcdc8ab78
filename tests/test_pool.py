"""The core's thread pool (csrc/pool.c): every item of every job runs
exactly once and before its job returns, with more threads than cores (the
workers then often wake late, after the caller has closed the job: the case
the join/close protocol exists for), and a forward pass is bit-identical
whatever the thread count."""

from __future__ import annotations

import os

import numpy as np
import pytest
from golden_sessions import MODELS

import ds4py
from ds4py._core import ffi, lib, new_error

DENSE = os.path.join(MODELS, "dense-q4_k_m.gguf")


@pytest.mark.parametrize("n_threads", [1, 2, 3, 8])
def test_every_item_runs_exactly_once(n_threads):
    err = new_error()
    rc = lib.ds4_pool_check(n_threads, 3000, 97, err)
    assert rc == lib.DS4_OK, ffi.string(err.message).decode()


def test_pool_check_refuses_bad_arguments():
    err = new_error()
    assert lib.ds4_pool_check(2, 0, 10, err) == lib.DS4_ERR_ARG
    assert b"n_jobs" in ffi.string(err.message)
    assert lib.ds4_pool_check(0, 10, 10, err) == lib.DS4_ERR_ARG


def test_logits_do_not_depend_on_thread_count():
    toks = [(13 * i + 7) % 400 for i in range(70)]
    out = []
    for n in (1, 2, 7):
        with ds4py.load(DENSE, n_threads=n) as m, m.new_session() as s:
            out.append(np.array(s.eval(toks, all_logits=True)))
    assert np.array_equal(out[0], out[1]) and np.array_equal(out[0], out[2])
