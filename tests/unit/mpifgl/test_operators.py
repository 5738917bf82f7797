"""mpifgl.operators: CSR slicing equals scipy's, the products equal scipy's (bit for bit below
TORCH_KERNEL_MIN_ENTRIES, to rounding above it), and sparse input features compute what dense
ones do."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from mpifgl import operators
from mpifgl.operators import CSRArrays, SparseFeatures, SparseMatrix, SparseOperator


@pytest.mark.parametrize("scipy_kernel", [True, False], ids=["tocsc-kernel", "argsort"])
def test_csr_row_column_selection_and_transpose_match_scipy(scipy_kernel, monkeypatch):
    """The sampled operators are sliced with bare CSR arrays every step: same entries, same
    order as scipy's csr[rows][:, cols] and .T.tocsr() (the transpose with scipy's counting
    sort, and with the argsort used where scipy does not export it)."""
    if not scipy_kernel:
        monkeypatch.setattr(operators, "_csr_tocsc", None)
    rng = np.random.default_rng(0)
    matrix = sp.random(60, 90, density=0.1, format="csr", random_state=1, dtype=np.float32)
    rows = np.sort(rng.choice(60, size=25, replace=False))
    cols = np.sort(rng.choice(90, size=40, replace=False))
    col_map = np.full(90, -1, dtype=np.int64)
    col_map[cols] = np.arange(cols.shape[0])
    selected = CSRArrays.of(matrix).select(rows, col_map, cols.shape[0])
    expected = matrix[rows][:, cols].tocsr()
    expected.sort_indices()
    got = sp.csr_matrix((selected.data, selected.indices, selected.indptr), shape=selected.shape)
    np.testing.assert_array_equal(got.toarray(), expected.toarray())
    np.testing.assert_array_equal(selected.indptr, expected.indptr)
    np.testing.assert_array_equal(selected.indices, expected.indices)
    transposed = selected.transpose()
    expected_t = expected.T.tocsr()
    np.testing.assert_array_equal(transposed.indptr, expected_t.indptr)
    np.testing.assert_array_equal(transposed.indices, expected_t.indices)
    np.testing.assert_array_equal(transposed.data, expected_t.data)
    empty = CSRArrays.of(matrix).select(np.zeros(0, np.int64), col_map, cols.shape[0])
    assert empty.shape == (0, cols.shape[0]) and empty.indptr.tolist() == [0]


@pytest.mark.parametrize("block_entries", [1, 7, 1 << 20])
def test_a_selection_in_blocks_and_of_a_pattern_is_the_whole_selection(block_entries,
                                                                        monkeypatch):
    """Gathered in blocks of rows (a row longer than a block gets one of its own), a selection
    is the one-pass selection; a pattern (every value 1) keeps no values of its own: its
    selection, transpose, row slice and dtype change stay patterns whose values are views of
    the shared ones, with the same entries as the weighted matrix's."""
    monkeypatch.setattr(operators, "SELECT_BLOCK_ENTRIES", block_entries)
    rng = np.random.default_rng(3)
    matrix = sp.random(50, 70, density=0.15, format="csr", random_state=2, dtype=np.float32)
    rows = np.sort(rng.choice(50, size=30, replace=False))
    col_map = np.where(rng.random(70) < 0.6, 0, -1)
    col_map[col_map == 0] = np.arange(int((col_map == 0).sum()))
    num_cols = int(col_map.max()) + 1
    selected = CSRArrays.of(matrix).select(rows, col_map, num_cols)
    expected = matrix[rows][:, np.flatnonzero(col_map >= 0)].tocsr()
    np.testing.assert_array_equal(selected.indptr, expected.indptr)
    np.testing.assert_array_equal(selected.indices, expected.indices)
    np.testing.assert_array_equal(selected.data, expected.data)
    ones = matrix.copy()
    ones.data[:] = 1
    with pytest.raises(ValueError, match="must hold 1 in every entry"):
        CSRArrays.of(matrix).as_unit()
    pattern = CSRArrays.of(ones).as_unit()
    derived = [pattern.select(rows, col_map, num_cols), pattern.transpose(),
               pattern.row_slice(5, 20), pattern.with_dtype(torch.float64)]
    plain = [CSRArrays.of(ones).select(rows, col_map, num_cols), CSRArrays.of(ones).transpose(),
             CSRArrays.of(ones).row_slice(5, 20), CSRArrays.of(ones).with_dtype(torch.float64)]
    for got, want in zip(derived, plain):
        assert got.unit and got.data.dtype == want.data.dtype and np.all(got.data == 1)
        buffer = operators.unit_values(got.nnz, got.data.dtype)
        assert got.nnz == 0 or np.shares_memory(got.data, buffer)
        np.testing.assert_array_equal(got.indptr, want.indptr)
        np.testing.assert_array_equal(got.indices, want.indices)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_csr_product_matches_scipy_and_its_autograd_uses_the_transpose(dtype):
    """SparseMatrix.matmul calls scipy's CSR kernel directly (no csr_matrix per call): the same
    values as csr_matrix @ dense, bit for bit, with empty rows, a non-contiguous input, and a
    wrong inner size refused; SparseOperator's backward is the transpose's product."""
    numpy_dtype = np.float64 if dtype == torch.float64 else np.float32
    matrix = sp.random(50, 30, density=0.08, format="csr", random_state=3, dtype=numpy_dtype)
    matrix[7] = 0  # an empty row
    matrix.eliminate_zeros()
    product = SparseMatrix(CSRArrays.of(matrix), dtype)
    dense = np.random.default_rng(4).standard_normal((12, 30)).astype(numpy_dtype).T  # 30 x 12, F-order
    got = product.matmul(torch.from_numpy(dense)).numpy()
    assert got.dtype == numpy_dtype and got.shape == (50, 12) and not got[7].any()
    np.testing.assert_array_equal(got, matrix @ np.ascontiguousarray(dense))
    with pytest.raises(ValueError, match="50 x 30 matrix with 29 rows"):
        product.matmul(torch.from_numpy(dense[:29]))
    assert product.row_slice(7, 9).matmul(torch.from_numpy(dense)).shape == (2, 12)
    assert product.matmul(torch.zeros((30, 0), dtype=dtype)).shape == (50, 0)
    operator = SparseOperator(matrix, dtype)
    y = torch.from_numpy(np.ascontiguousarray(dense)).requires_grad_(True)
    out = operator @ y
    np.testing.assert_array_equal(out.detach().numpy(), got)
    weights = torch.from_numpy(np.random.default_rng(5).standard_normal((50, 12)).astype(numpy_dtype))
    (out * weights).sum().backward()
    np.testing.assert_array_equal(y.grad.numpy(), matrix.T.tocsr() @ weights.numpy())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_large_matrix_runs_in_torchs_kernel_with_the_same_bits_on_any_thread_count(
        dtype, monkeypatch):
    """From TORCH_KERNEL_MIN_ENTRIES entries a product runs in torch's CSR kernel (below, in
    scipy's: the test above): equal to scipy's to the rounding of the accumulation, with
    empty rows and int64 indices, and the same bits on 1 to 4 threads (--threads)."""
    numpy_dtype = np.float64 if dtype == torch.float64 else np.float32
    matrix = sp.random(400, 300, density=0.2, format="csr", random_state=6, dtype=numpy_dtype)
    emptied = np.ones(400, dtype=numpy_dtype)
    emptied[[3, 250]] = 0
    matrix = (sp.diags(emptied) @ matrix).tocsr()
    matrix.eliminate_zeros()
    assert matrix.nnz >= operators.TORCH_KERNEL_MIN_ENTRIES
    ran = []
    kernel = operators.torch_csr_product
    monkeypatch.setattr(operators, "torch_csr_product", lambda *a: ran.append(1) or kernel(*a))
    arrays = CSRArrays.of(matrix)
    wide = CSRArrays(arrays.indptr.astype(np.int64), arrays.indices, arrays.data, arrays.shape)
    dense = np.random.default_rng(7).standard_normal((300, 9)).astype(numpy_dtype)
    tolerance = 1e-12 if dtype == torch.float64 else 1e-5
    threads = torch.get_num_threads()
    results = []
    try:
        for count in (1, 2, 3, 4):
            torch.set_num_threads(count)
            for held in (arrays, wide):
                results.append(SparseMatrix(held, dtype).matmul(torch.from_numpy(dense)))
    finally:
        torch.set_num_threads(threads)
    assert len(ran) == len(results)
    np.testing.assert_allclose(results[0].numpy(), matrix @ dense, rtol=tolerance, atol=tolerance)
    assert not results[0][[3, 250]].any()
    for other in results[1:]:
        assert torch.equal(other, results[0])


def test_sparse_features_products_rows_and_dropout_equal_the_dense_ones():
    """SparseFeatures' X W^T (float64 accumulation, one rounding) and its gradient equal the
    dense product's; rows select, and dropout on the stored entries scales by 1/(1-p)."""
    rng = np.random.default_rng(2)
    x = np.where(rng.random((20, 9)) < 0.2, rng.standard_normal((20, 9)), 0.0)
    features = SparseFeatures.of_dense(torch.from_numpy(x))
    weight = torch.from_numpy(rng.standard_normal((4, 9))).requires_grad_(True)
    out = features.linear(weight)
    torch.testing.assert_close(out, torch.from_numpy(x) @ weight.T, rtol=1e-14, atol=1e-14)
    out.sum().backward()
    torch.testing.assert_close(weight.grad, torch.ones(20, 4, dtype=torch.float64).T
                               @ torch.from_numpy(x), rtol=1e-14, atol=1e-14)
    rows = features.rows(torch.tensor([3, 0]))
    np.testing.assert_array_equal(rows.matrix.toarray(), x[[3, 0]])
    draws = torch.from_numpy(np.linspace(0, 1, features.nnz, endpoint=False, dtype=np.float32))
    dropped = features.dropout(0.5, draws)
    kept = draws.numpy() >= 0.5
    np.testing.assert_array_equal(dropped.matrix.data, features.matrix.data * kept / 0.5)
