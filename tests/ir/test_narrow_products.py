"""narrow_products: a matmul's operand that is a view of a widened half tensor becomes the
widened view of that tensor (golden text), and nothing else changes."""
from __future__ import annotations

import textwrap

from tracecomp.ir.parser import parse_graph
from tracecomp.ir.passes import dce, narrow_products
from tracecomp.ir.printer import print_graph
from tracecomp.ir.verifier import verify


def check(before: str, after: str) -> None:
    graph = parse_graph(textwrap.dedent(before))
    verify(graph)
    out = dce(narrow_products(graph))
    verify(out)
    assert print_graph(out) == textwrap.dedent(after).strip()


def test_the_transpose_of_a_widened_weight_moves_under_the_cast():
    check("""
        func.func @f(%arg0: tensor<4x8xbf16>, %arg1: tensor<3x8xbf16>) -> (tensor<4x3xf32>) {
          %0 = "tc.to"(%arg0) {dtype = f32} : (tensor<4x8xbf16>) -> tensor<4x8xf32>
          %1 = "tc.to"(%arg1) {dtype = f32} : (tensor<3x8xbf16>) -> tensor<3x8xf32>
          %2 = "tc.permute"(%1) {dims = array<i64: 1, 0>} : (tensor<3x8xf32>) -> tensor<8x3xf32>
          %3 = "tc.matmul"(%0, %2) : (tensor<4x8xf32>, tensor<8x3xf32>) -> tensor<4x3xf32>
          return %3 : tensor<4x3xf32>
        }""", """
        func.func @f(%arg0: tensor<4x8xbf16>, %arg1: tensor<3x8xbf16>) -> (tensor<4x3xf32>) {
          %0 = "tc.to"(%arg0) {dtype = f32} : (tensor<4x8xbf16>) -> tensor<4x8xf32>
          %1 = "tc.permute"(%arg1) {dims = array<i64: 1, 0>} : (tensor<3x8xbf16>) -> tensor<8x3xbf16>
          %2 = "tc.to"(%1) {dtype = f32} : (tensor<8x3xbf16>) -> tensor<8x3xf32>
          %3 = "tc.matmul"(%0, %2) : (tensor<4x8xf32>, tensor<8x3xf32>) -> tensor<4x3xf32>
          return %3 : tensor<4x3xf32>
        }""")


def test_a_chain_of_views_moves_in_order():
    check("""
        func.func @f(%arg0: tensor<2x4x8xf16>, %arg1: tensor<8x3xf32>) -> (tensor<3x8xf32>) {
          %0 = "tc.to"(%arg0) {dtype = f32} : (tensor<2x4x8xf16>) -> tensor<2x4x8xf32>
          %1 = "tc.reshape"(%0) {shape = array<i64: 8, 8>} : (tensor<2x4x8xf32>) -> tensor<8x8xf32>
          %2 = "tc.permute"(%1) {dims = array<i64: 1, 0>} : (tensor<8x8xf32>) -> tensor<8x8xf32>
          %3 = "tc.permute"(%arg1) {dims = array<i64: 1, 0>} : (tensor<8x3xf32>) -> tensor<3x8xf32>
          %4 = "tc.matmul"(%3, %2) : (tensor<3x8xf32>, tensor<8x8xf32>) -> tensor<3x8xf32>
          return %4 : tensor<3x8xf32>
        }""", """
        func.func @f(%arg0: tensor<2x4x8xf16>, %arg1: tensor<8x3xf32>) -> (tensor<3x8xf32>) {
          %0 = "tc.permute"(%arg1) {dims = array<i64: 1, 0>} : (tensor<8x3xf32>) -> tensor<3x8xf32>
          %1 = "tc.reshape"(%arg0) {shape = array<i64: 8, 8>} : (tensor<2x4x8xf16>) -> tensor<8x8xf16>
          %2 = "tc.permute"(%1) {dims = array<i64: 1, 0>} : (tensor<8x8xf16>) -> tensor<8x8xf16>
          %3 = "tc.to"(%2) {dtype = f32} : (tensor<8x8xf16>) -> tensor<8x8xf32>
          %4 = "tc.matmul"(%0, %3) : (tensor<3x8xf32>, tensor<8x8xf32>) -> tensor<3x8xf32>
          return %4 : tensor<3x8xf32>
        }""")


def test_views_of_float32_and_narrowing_casts_stay():
    text = """
        func.func @f(%arg0: tensor<4x8xf32>, %arg1: tensor<3x8xf64>) -> (tensor<4x3xf32>) {
          %0 = "tc.to"(%arg1) {dtype = f32} : (tensor<3x8xf64>) -> tensor<3x8xf32>
          %1 = "tc.permute"(%0) {dims = array<i64: 1, 0>} : (tensor<3x8xf32>) -> tensor<8x3xf32>
          %2 = "tc.matmul"(%arg0, %1) : (tensor<4x8xf32>, tensor<8x3xf32>) -> tensor<4x3xf32>
          return %2 : tensor<4x3xf32>
        }"""
    check(text, text)


def test_a_convolutions_window_matrix_moves_under_the_cast():
    """im2col only moves elements (and zeros): the window matrix of a widened half input
    becomes the widened window matrix of the half input (the half GEMM reads it)."""
    check("""
        func.func @f(%arg0: tensor<1x2x4x4xbf16>, %arg1: tensor<1x3x18xf32>) -> (tensor<1x1x3x16xf32>) {
          %0 = "tc.to"(%arg0) {dtype = f32} : (tensor<1x2x4x4xbf16>) -> tensor<1x2x4x4xf32>
          %1 = "tc.im2col"(%0) {kernel_size = array<i64: 3, 3>, dilation = array<i64: 1, 1>, padding = array<i64: 1, 1>, stride = array<i64: 1, 1>} : (tensor<1x2x4x4xf32>) -> tensor<1x18x16xf32>
          %2 = "tc.reshape"(%1) {shape = array<i64: 1, 1, -1, 16>} : (tensor<1x18x16xf32>) -> tensor<1x1x18x16xf32>
          %3 = "tc.matmul"(%arg1, %2) : (tensor<1x3x18xf32>, tensor<1x1x18x16xf32>) -> tensor<1x1x3x16xf32>
          return %3 : tensor<1x1x3x16xf32>
        }""", """
        func.func @f(%arg0: tensor<1x2x4x4xbf16>, %arg1: tensor<1x3x18xf32>) -> (tensor<1x1x3x16xf32>) {
          %0 = "tc.im2col"(%arg0) {kernel_size = array<i64: 3, 3>, dilation = array<i64: 1, 1>, padding = array<i64: 1, 1>, stride = array<i64: 1, 1>} : (tensor<1x2x4x4xbf16>) -> tensor<1x18x16xbf16>
          %1 = "tc.reshape"(%0) {shape = array<i64: 1, 1, -1, 16>} : (tensor<1x18x16xbf16>) -> tensor<1x1x18x16xbf16>
          %2 = "tc.to"(%1) {dtype = f32} : (tensor<1x1x18x16xbf16>) -> tensor<1x1x18x16xf32>
          %3 = "tc.matmul"(%arg1, %2) : (tensor<1x3x18xf32>, tensor<1x1x18x16xf32>) -> tensor<1x1x3x16xf32>
          return %3 : tensor<1x1x3x16xf32>
        }""")
