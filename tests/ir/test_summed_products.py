"""summed_products: sum over the batch of x.mT @ g is one product over the batch's rows
(golden text, values), and what does not fit the pattern stays."""
from __future__ import annotations

import textwrap

import numpy as np

import tracecomp as tc
from tracecomp.ir.parser import parse_graph
from tracecomp.ir.passes import dce, summed_products
from tracecomp.ir.printer import print_graph
from tracecomp.ir.verifier import verify

BEFORE = """
    func.func @f(%arg0: tensor<2x5x4xf32>, %arg1: tensor<2x5x3xf32>) -> (tensor<1x4x3xf32>) {
      %0 = "tc.permute"(%arg0) {dims = array<i64: 0, 2, 1>} : (tensor<2x5x4xf32>) -> tensor<2x4x5xf32>
      %1 = "tc.matmul"(%0, %arg1) : (tensor<2x4x5xf32>, tensor<2x5x3xf32>) -> tensor<2x4x3xf32>
      %2 = "tc.sum"(%1) {dim = array<i64: 0>, keepdim = true, dtype} : (tensor<2x4x3xf32>) -> tensor<1x4x3xf32>
      return %2 : tensor<1x4x3xf32>
    }"""


def run(text: str) -> str:
    graph = parse_graph(textwrap.dedent(text))
    verify(graph)
    out = dce(summed_products(graph))
    verify(out)
    return print_graph(out)


def test_a_batch_summed_weight_gradient_is_one_product():
    assert run(BEFORE) == textwrap.dedent("""
        func.func @f(%arg0: tensor<2x5x4xf32>, %arg1: tensor<2x5x3xf32>) -> (tensor<1x4x3xf32>) {
          %0 = "tc.reshape"(%arg0) {shape = array<i64: 10, 4>} : (tensor<2x5x4xf32>) -> tensor<10x4xf32>
          %1 = "tc.permute"(%0) {dims = array<i64: 1, 0>} : (tensor<10x4xf32>) -> tensor<4x10xf32>
          %2 = "tc.reshape"(%arg1) {shape = array<i64: 10, 3>} : (tensor<2x5x3xf32>) -> tensor<10x3xf32>
          %3 = "tc.matmul"(%1, %2) : (tensor<4x10xf32>, tensor<10x3xf32>) -> tensor<4x3xf32>
          %4 = "tc.reshape"(%3) {shape = array<i64: 1, 4, 3>} : (tensor<4x3xf32>) -> tensor<1x4x3xf32>
          return %4 : tensor<1x4x3xf32>
        }""").strip()


NOT_THE_BATCH = """
    func.func @f(%arg0: tensor<2x5x4xf32>, %arg1: tensor<2x5x3xf32>) -> (tensor<2x1x3xf32>) {
      %0 = "tc.permute"(%arg0) {dims = array<i64: 0, 2, 1>} : (tensor<2x5x4xf32>) -> tensor<2x4x5xf32>
      %1 = "tc.matmul"(%0, %arg1) : (tensor<2x4x5xf32>, tensor<2x5x3xf32>) -> tensor<2x4x3xf32>
      %2 = "tc.sum"(%1) {dim = array<i64: 1>, keepdim = true, dtype} : (tensor<2x4x3xf32>) -> tensor<2x1x3xf32>
      return %2 : tensor<2x1x3xf32>
    }"""
NOT_TRANSPOSED = """
    func.func @f(%arg0: tensor<2x4x5xf32>, %arg1: tensor<2x5x3xf32>) -> (tensor<1x4x3xf32>) {
      %0 = "tc.matmul"(%arg0, %arg1) : (tensor<2x4x5xf32>, tensor<2x5x3xf32>) -> tensor<2x4x3xf32>
      %1 = "tc.sum"(%0) {dim = array<i64: 0>, keepdim = true, dtype} : (tensor<2x4x3xf32>) -> tensor<1x4x3xf32>
      return %1 : tensor<1x4x3xf32>
    }"""


def test_other_sums_and_products_stay():
    for text in (NOT_THE_BATCH, NOT_TRANSPOSED):
        assert run(text) == print_graph(parse_graph(textwrap.dedent(text)))


def test_a_linear_weight_gradient_matches_numpy():
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((3, 7, 5)).astype(np.float32), rng.standard_normal((4, 5)).astype(np.float32)
    f = tc.trace(tc.grad(lambda x, w: tc.nn.functional.linear(x, w).sum(), argnums=1))
    assert '"tc.sum"(' not in f.lower(x, w).as_text("optimized")
    np.testing.assert_allclose(np.asarray(f(x, w)), np.ones((21, 4)).T @ x.reshape(-1, 5), rtol=1e-5)
