// Host check of the mma.sync GEMM kernel's index maps (cuda_ext/csrc/gemm_layout.h, the functions the kernel
// calls) against the PTX ISA's layouts, for both tile configurations: the cp.async copies fill each shared
// tile exactly once, every ldmatrix gives each lane the elements of the m16n8k16 A/B fragments, the C staging
// holds each accumulator once, and no shared-memory phase has a bank conflict. Prints "ok" or the failures.
// Built and run by test_gemm_layout.py with the host C++ compiler.
#include <cstdio>
#include <vector>

#include "gemm_layout.h"

using namespace pp::gemm_layout;

namespace {

int failures = 0;

#define CHECK(cond, ...)                                                      \
  do {                                                                        \
    if (!(cond)) {                                                            \
      if (failures++ < 20) {                                                  \
        std::printf("FAIL line %d (%s): ", __LINE__, #cond);                  \
        std::printf(__VA_ARGS__);                                             \
        std::printf("\n");                                                    \
      }                                                                       \
    }                                                                         \
  } while (0)

struct Element {
  int row = -1, col = -1;
};

// A 128-byte shared-memory wavefront (8 x 16 bytes) is conflict-free when its 16-byte pieces lie in 8
// different bank groups.
bool one_wavefront(const unsigned (&offsets)[8]) {
  unsigned groups = 0;
  for (unsigned offset : offsets) groups |= 1u << ((offset / 16) % 8);
  return groups == 0xffu;
}

// Which tile element each shared element holds after every thread's cp.async copies of one k-tile.
template <class Plan, int Threads, int Rows, int RowElems>
std::vector<Element> copy_tile(const char* name) {
  std::vector<Element> smem(Rows * RowElems);
  for (int pass = 0; pass < Plan::kPasses; ++pass) {
    for (int tid0 = 0; tid0 < Threads; tid0 += 8) {
      unsigned wavefront[8];
      for (int tid = tid0; tid < tid0 + 8; ++tid) {
        const int row = Plan::row(tid, pass), chunk = Plan::chunk(tid);
        const unsigned offset = Plan::smem_offset(tid) + pass * Plan::kPassBytes;
        wavefront[tid - tid0] = offset;
        CHECK(row < Rows && chunk < RowElems / kChunkElems, "%s tid %d pass %d", name, tid, pass);
        // The kernel adds pass * kPassBytes to the pass-0 destination: it must be the chunk's own place.
        CHECK(offset == chunk_offset(row, chunk, RowElems), "%s tid %d pass %d", name, tid, pass);
        CHECK(offset % 16 == 0 && offset + 16 <= static_cast<unsigned>(Rows * RowElems * kElemBytes), "%s tid %d",
              name, tid);
        for (int e = 0; e < kChunkElems; ++e) {
          Element& slot = smem[offset / kElemBytes + e];
          CHECK(slot.row < 0, "%s: element slot %u written twice", name, offset / kElemBytes + e);
          slot = {row, chunk * kChunkElems + e};
        }
      }
      CHECK(one_wavefront(wavefront), "%s: cp.async writes of threads %d-%d conflict", name, tid0, tid0 + 7);
    }
  }
  for (const Element& slot : smem) CHECK(slot.row >= 0, "%s: a shared element is never written", name);
  return smem;
}

// ldmatrix .x4 (PTX ISA): lanes 8q .. 8q + 7 give the row addresses of 8x8 matrix q, and thread t receives
// row t / 4, elements 2 (t % 4) and 2 (t % 4) + 1 of it in register q; with .trans, column t / 4, rows 2 (t % 4)
// and 2 (t % 4) + 1. The shared byte offset of thread t's register q, half e:
unsigned ldmatrix_source(const unsigned (&lane_offsets)[32], int t, int q, int e, bool trans) {
  const int row = trans ? 2 * (t % 4) + e : t / 4;
  const int col = trans ? t / 4 : 2 * (t % 4) + e;
  return lane_offsets[8 * q + row] + col * kElemBytes;
}

void check_ldmatrix_phases(const unsigned (&lane_offsets)[32], const char* name) {
  for (int q = 0; q < 4; ++q) {
    unsigned wavefront[8];
    for (int r = 0; r < 8; ++r) {
      wavefront[r] = lane_offsets[8 * q + r];
      CHECK(wavefront[r] % 16 == 0, "%s: ldmatrix row address %u is not 16-byte aligned", name, wavefront[r]);
    }
    CHECK(one_wavefront(wavefront), "%s: ldmatrix matrix %d has a bank conflict", name, q);
  }
}

template <int BM, int BN, int WarpsM, int WarpsN>
void check_config() {
  constexpr int kBK = 64, kThreads = WarpsM * WarpsN * 32, kWM = BM / WarpsM, kWN = BN / WarpsN;
  using APlan = CopyPlan<kThreads, BM, kBK>;
  using BPlan = CopyPlan<kThreads, kBK, BN>;
  const std::vector<Element> a_smem = copy_tile<APlan, kThreads, BM, kBK>("A");
  const std::vector<Element> b_smem = copy_tile<BPlan, kThreads, kBK, BN>("B");

  for (int warp_m = 0; warp_m < WarpsM; ++warp_m) {
    for (int step = 0; step < kBK / 16; ++step) {
      for (int i = 0; i < kWM / 16; ++i) {
        unsigned lanes[32];
        for (int l = 0; l < 32; ++l) lanes[l] = a_fragment_offset(warp_m * kWM, i, step, l, kBK);
        check_ldmatrix_phases(lanes, "A");
        // m16n8k16 A fragment: a0 (g, 2c + e), a1 (g + 8, 2c + e), a2 (g, 2c + 8 + e), a3 (g + 8, 2c + 8 + e)
        // with g = lane / 4, c = lane % 4, in the warp's 16-row slab i and the k-step's 16 columns.
        for (int t = 0; t < 32; ++t) {
          for (int q = 0; q < 4; ++q) {
            for (int e = 0; e < 2; ++e) {
              const Element got = a_smem[ldmatrix_source(lanes, t, q, e, false) / kElemBytes];
              const int row = warp_m * kWM + 16 * i + t / 4 + 8 * (q % 2);
              const int col = 16 * step + 2 * (t % 4) + e + 8 * (q / 2);
              CHECK(got.row == row && got.col == col, "A warp_m %d step %d i %d lane %d a%d.%d: (%d, %d) != (%d, %d)",
                    warp_m, step, i, t, q, e, got.row, got.col, row, col);
            }
          }
        }
      }
    }
  }

  for (int warp_n = 0; warp_n < WarpsN; ++warp_n) {
    for (int step = 0; step < kBK / 16; ++step) {
      for (int j = 0; j < kWN / 16; ++j) {
        unsigned lanes[32];
        for (int l = 0; l < 32; ++l) lanes[l] = b_fragment_offset(warp_n * kWN, j, step, l, BN);
        check_ldmatrix_phases(lanes, "B");
        // m16n8k16 B fragment: b0 (k = 2c + e, n = g), b1 (k = 2c + 8 + e, n = g). Registers 0, 1 are b0, b1 of
        // n8 tile 2j, registers 2, 3 those of n8 tile 2j + 1.
        for (int t = 0; t < 32; ++t) {
          for (int q = 0; q < 4; ++q) {
            for (int e = 0; e < 2; ++e) {
              const Element got = b_smem[ldmatrix_source(lanes, t, q, e, true) / kElemBytes];
              const int k_row = 16 * step + 2 * (t % 4) + e + 8 * (q % 2);
              const int col = warp_n * kWN + 16 * j + 8 * (q / 2) + t / 4;
              CHECK(got.row == k_row && got.col == col,
                    "B warp_n %d step %d j %d lane %d reg %d.%d: (%d, %d) != (%d, %d)", warp_n, step, j, t, q, e,
                    got.row, got.col, k_row, col);
            }
          }
        }
      }
    }
  }

  // C staging: m16n8 accumulator c0, c1 at (g, 2c), (g, 2c + 1), c2, c3 at (g + 8, ...). Each element once, in
  // its place; per store instruction the 32 lanes' 4-byte (bf16/fp16 pairs) or 8-byte (fp32 pairs, per
  // half-warp) stores touch every bank once.
  const int pitch = c_staging_pitch(BN);
  std::vector<int> written(BM * pitch, 0);
  for (int warp = 0; warp < WarpsM * WarpsN; ++warp) {
    const int warp_m = warp / WarpsN, warp_n = warp % WarpsN;
    for (int i = 0; i < kWM / 16; ++i) {
      for (int j = 0; j < kWN / 8; ++j) {
        for (int pair = 0; pair < 2; ++pair) {
          unsigned banks2 = 0;
          unsigned banks4[2] = {0, 0};
          for (int l = 0; l < 32; ++l) {
            const int index = c_staging_index(warp_m * kWM, warp_n * kWN, i, j, pair, l, BN);
            const int row = warp_m * kWM + 16 * i + l / 4 + 8 * pair, col = warp_n * kWN + 8 * j + 2 * (l % 4);
            CHECK(index / pitch == row && index % pitch == col, "C warp %d i %d j %d lane %d", warp, i, j, l);
            CHECK(index % 2 == 0, "C pairs are aligned");
            written[index] += 1;
            written[index + 1] += 1;
            banks2 |= 1u << ((index * 2 / 4) % 32);
            for (int word = 0; word < 2; ++word) banks4[l / 16] |= 1u << ((index * 4 / 4 + word) % 32);
          }
          CHECK(banks2 == 0xffffffffu, "C bf16 pair stores conflict (warp %d i %d j %d)", warp, i, j);
          CHECK(banks4[0] == 0xffffffffu && banks4[1] == 0xffffffffu, "C fp32 pair stores conflict (warp %d)", warp);
        }
      }
    }
  }
  for (int r = 0; r < BM; ++r) {
    for (int col = 0; col < pitch; ++col) {
      CHECK(written[r * pitch + col] == (col < BN ? 1 : 0), "C staging (%d, %d) written %d times", r, col,
            written[r * pitch + col]);
    }
  }
}

}  // namespace

int main() {
  check_config<128, 256, 2, 4>();  // mma_128x256
  check_config<128, 128, 2, 2>();  // mma_128x128
  if (failures) {
    std::printf("%d failures\n", failures);
    return 1;
  }
  std::printf("ok\n");
  return 0;
}
