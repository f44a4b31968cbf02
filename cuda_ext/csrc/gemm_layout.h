// Index maps of the mma.sync GEMM kernel (gemm_cuda.cu), in plain C++ so a host program can check them
// exhaustively against the PTX fragment layouts (tests/cuda_ext/test_gemm_layout.py) where no GPU runs them.
//
// Shared tiles are row-major: A [BM][BK], B [BK][BN], C staging [BM][BN + 8]. Operand rows are made of
// 16-byte chunks (8 bf16/fp16 elements); chunk c of row r is stored at chunk c ^ (r % 8). An ldmatrix phase
// reads the same logical chunk of 8 consecutive rows starting at a multiple of 8: after the XOR those are 8
// different chunks of an aligned group of 8, i.e. every bank once for any row length that is a multiple of
// 128 bytes, with no padding. A row's cp.async writes are only permuted by it.
#pragma once

#include "common.h"

namespace pp {
namespace gemm_layout {

constexpr int kElemBytes = 2;  // bf16 / fp16 operands
constexpr int kChunkElems = 8;  // 16 bytes

PP_HD constexpr int swizzle(int row, int chunk) { return chunk ^ (row & 7); }

// Byte offset in a stage of the chunk holding elements [row][8 chunk, 8 chunk + 8).
PP_HD constexpr unsigned chunk_offset(int row, int chunk, int row_elems) {
  return static_cast<unsigned>((row * row_elems + swizzle(row, chunk) * kChunkElems) * kElemBytes);
}

// Global -> shared copies of a [Rows][RowElems] tile by Threads threads: thread t copies chunk t % Chunks of rows
// t / Chunks + p * RowsPerPass, p < Passes. RowsPerPass is a multiple of 8, so a thread's swizzled chunk is the
// same in every pass and its destinations are kPassBytes apart (the kernel adds p * kPassBytes).
template <int Threads, int Rows, int RowElems>
struct CopyPlan {
  static constexpr int kChunks = RowElems / kChunkElems;
  static constexpr int kRowsPerPass = Threads / kChunks;
  static constexpr int kPasses = Rows / kRowsPerPass;
  static constexpr unsigned kPassBytes = static_cast<unsigned>(kRowsPerPass * RowElems * kElemBytes);
  static_assert(RowElems % (8 * kChunkElems) == 0, "rows of whole swizzle groups (128-byte multiples)");
  static_assert(Threads % kChunks == 0 && Rows % kRowsPerPass == 0 && kRowsPerPass % 8 == 0, "whole passes");

  PP_HD static constexpr int row(int tid, int pass) { return tid / kChunks + pass * kRowsPerPass; }
  PP_HD static constexpr int chunk(int tid) { return tid % kChunks; }
  // Destination of pass 0; pass p is at + p * kPassBytes.
  PP_HD static constexpr unsigned smem_offset(int tid) { return chunk_offset(row(tid, 0), chunk(tid), RowElems); }
};

// ldmatrix.x4: lane l gives the address of row l % 16 of a 16-row slab, at 16-byte chunk l / 16 of the slab's
// two. On A [m][k] the four 8x8 results are the m16n8k16 A fragment a0..a3; with .trans on B [k][n] they are
// b0, b1 of the n8 tile at the slab's first chunk and b0, b1 of the next one.

// Address (bytes in a stage) lane gives for the A fragment of m16 tile i (rows row_base + 16 i ..) at k-step step.
PP_HD constexpr unsigned a_fragment_offset(int row_base, int i, int step, int lane, int bk) {
  return chunk_offset(row_base + i * 16 + lane % 16, step * 2 + lane / 16, bk);
}

// Address lane gives for the B fragments of n8 tiles 2 j and 2 j + 1 (columns col_base + 16 j ..) at k-step step.
PP_HD constexpr unsigned b_fragment_offset(int col_base, int j, int step, int lane, int bn) {
  return chunk_offset(step * 16 + lane % 16, (col_base + 16 * j) / kChunkElems + lane / 16, bn);
}

// C staging: the row pitch (elements), padded by 8 so a warp's accumulator pair stores (8 rows x 4 lanes, 4 or 8
// bytes each) cover all 32 banks once per phase.
PP_HD constexpr int c_staging_pitch(int bn) { return bn + 8; }

// Element index in the staging tile of accumulator pair e (0: c0 c1, 1: c2 c3) of m16n8 tile (i, j) for lane.
PP_HD constexpr int c_staging_index(int row_base, int col_base, int i, int j, int pair, int lane, int bn) {
  return (row_base + i * 16 + lane / 4 + 8 * pair) * c_staging_pitch(bn) + col_base + j * 8 + (lane % 4) * 2;
}

}  // namespace gemm_layout
}  // namespace pp
