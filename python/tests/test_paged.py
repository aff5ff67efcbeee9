"""sdpa.attention_paged against sdpa.attention on gathered dense copies (the same bits where blocks
hold a multiple of 64 keys) and the float64 reference of conftest.py, on NumPy arrays and torch
tensors."""

import numpy as np
import pytest

import sdpa
from conftest import reference


def make_batch(rng, dtype, block_size=4, causal=True):
    """A random batch: sequences of 0, 1 and several rows, blocks scattered in a pool whose
    unused blocks hold NaN."""
    heads_q, heads_kv, d = 4, 2, 16
    rows = [3, 1, 0, 5]
    keys = [9, 1, 7, 5]
    needed = [-(-n // block_size) for n in keys]
    num_blocks = sum(needed) + 3
    perm = rng.permutation(num_blocks)
    table = np.full((len(rows), max(needed) + 1), -1, dtype=np.int32)
    at = 0
    for s, n in enumerate(needed):
        table[s, :n] = perm[at:at + n]
        at += n
    k_pool = np.full((num_blocks, heads_kv, block_size, d), np.nan, dtype=dtype)
    v_pool = np.full((num_blocks, heads_kv, block_size, d), np.nan, dtype=dtype)
    for s, n in enumerate(keys):
        for j in range(n):
            b, t = table[s, j // block_size], j % block_size
            k_pool[b, :, t] = rng.standard_normal((heads_kv, d))
            v_pool[b, :, t] = rng.standard_normal((heads_kv, d))
    q_start = np.concatenate([[0], np.cumsum(rows)]).astype(np.int32)
    q = rng.standard_normal((int(q_start[-1]), heads_q, d)).astype(dtype)
    return q, k_pool, v_pool, table, q_start, np.array(keys, dtype=np.int32)


def gather(pool, table, s, n):
    """(heads_kv, n, d): sequence s's first n keys, dense."""
    block_size = pool.shape[2]
    return np.stack([pool[table[s, j // block_size], :, j % block_size] for j in range(n)], 1)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("block_size", [1, 4, 16, 64])
def test_matches_dense_and_reference(dtype, block_size):
    rng = np.random.default_rng(36)
    q, k_pool, v_pool, table, q_start, kv_len = make_batch(rng, dtype, block_size)
    out, lse = sdpa.attention_paged(q, k_pool, v_pool, table, q_start, kv_len, causal=True,
                                    return_lse=True)
    assert out.shape == q.shape and out.dtype == q.dtype and lse.shape == q.shape[:2]
    for s in range(len(kv_len)):
        r0, r1 = q_start[s], q_start[s + 1]
        if r0 == r1:
            continue
        qs = np.ascontiguousarray(q[r0:r1].transpose(1, 0, 2))[None]
        ks = gather(k_pool, table, s, kv_len[s])[None]
        vs = gather(v_pool, table, s, kv_len[s])[None]
        if block_size % 64 == 0:
            dense, dense_lse = sdpa.attention(qs, ks, vs, causal=True, return_lse=True)
            np.testing.assert_array_equal(out[r0:r1], dense[0].transpose(1, 0, 2))
            np.testing.assert_array_equal(lse[r0:r1], dense_lse[0].T)
        want, want_lse = reference(qs, ks, vs, causal=True)
        np.testing.assert_allclose(lse[r0:r1], want_lse[0].T, rtol=1e-5, atol=1e-5)
        tol = 1e-5 * np.abs(vs.astype(np.float64)).max() + (1e-3 if dtype == np.float16 else 1e-7)
        np.testing.assert_allclose(out[r0:r1].astype(np.float64), want[0].transpose(1, 0, 2),
                                   atol=tol, rtol=1e-3 if dtype == np.float16 else 0)


def test_rows_without_keys_are_zeros():
    rng = np.random.default_rng(37)
    q, k_pool, v_pool, table, q_start, kv_len = make_batch(rng, np.float32)
    kv_len[1] = 0
    out, lse = sdpa.attention_paged(q, k_pool, v_pool, table, q_start, kv_len, return_lse=True)
    r = q_start[1]
    assert (out[r] == 0).all() and (lse[r] == -np.inf).all()


def test_errors_name_the_argument():
    rng = np.random.default_rng(38)
    q, k_pool, v_pool, table, q_start, kv_len = make_batch(rng, np.float32)
    bad = table.copy()
    bad[0, 0] = k_pool.shape[0]
    with pytest.raises(ValueError, match="block_table"):
        sdpa.attention_paged(q, k_pool, v_pool, bad, q_start, kv_len, causal=True)
    short = kv_len.copy()
    short[0] = 2
    with pytest.raises(ValueError, match="causal"):
        sdpa.attention_paged(q, k_pool, v_pool, table, q_start, short, causal=True)
    with pytest.raises(ValueError, match="q_start"):
        sdpa.attention_paged(q, k_pool, v_pool, table, q_start[:-1], kv_len)


def test_torch_matches_numpy():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(39)
    q, k_pool, v_pool, table, q_start, kv_len = make_batch(rng, np.float32)
    want = sdpa.attention_paged(q, k_pool, v_pool, table, q_start, kv_len, causal=True)
    got = sdpa.attention_paged(torch.from_numpy(q), torch.from_numpy(k_pool),
                               torch.from_numpy(v_pool), torch.from_numpy(table),
                               torch.from_numpy(q_start), torch.from_numpy(kv_len), causal=True)
    assert isinstance(got, torch.Tensor)
    np.testing.assert_array_equal(got.numpy(), want)
