// Intel AMX as the bf16 attention uses it: eight tile registers of 16 rows x 64 bytes
// (palette 1, every tile configured whole) and one product, TDPBF16PS:
//   C [16 x 16 fp32] += A [16 x 32 bf16] . B [16 pair rows x 16 words],
// word (p, n) of B holding B[2p][n] (low half) and B[2p+1][n] (high half), the layout
// vdpbf16ps reads too. The attention's AMX engine (attention_amx.hpp) is written against
// the small interface below (configure, release, zero, load, store, dpbf16ps), which has two
// implementations:
//   EmulatedTiles (here): portable C++ with the instruction's arithmetic, so every host,
//     AMD ones without AMX included, runs and tests the AMX kernel;
//   AmxTiles (attention_amx.cpp, compiled with -mamx-tile -mamx-bf16): the intrinsics.
// Tile indices are template arguments: the instructions take them as immediates.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "kernels/fault_guard.hpp"

namespace minicp::kernels::amx {

constexpr int kTileRows = 16;   // rows of every tile
constexpr int kTileBytes = 64;  // bytes of a tile row: 32 bf16 of A, 16 words of B, 16 fp32 of C
constexpr int kTileK = 32;      // the k of one product: A's 32 bf16 per row, B's 16 pair rows
constexpr int kTileN = 16;      // the columns of C and of B's words

// A bf16 (its bits) as TDPBF16PS reads it: widened to fp32, a denormal read as zero (of its sign).
inline float make_fp32(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  if ((u & 0x7f800000u) == 0) u &= 0x80000000u;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// An fp32 result as TDPBF16PS writes it: a denormal flushed to zero (of its sign).
inline float flush_denormal(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7f800000u) == 0) u &= 0x80000000u;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// The tile operations in portable C++, per thread (tile state is a thread's, as on the CPU).
// dpbf16ps follows the pseudo-code of Intel's SDM for TDPBF16PS: for each row m of C, for
// k = 0..15 in order, for each column n, two fp32 additions, the even pair's product first:
//   c += fp32(a[m][2k]) * fp32(b[k][2n]);  c += fp32(a[m][2k+1]) * fp32(b[k][2n+1])
// each rounded to nearest even (MXCSR is not consulted), denormal inputs read as zero and
// denormal results flushed. A product of two normal bf16 is exact in fp32 (8 x 8 significant
// bits) unless it falls below fp32's normal range, where it is flushed too; the file that
// instantiates this is compiled with -ffp-contract=off, so product and sum round apart.
struct EmulatedTiles {
  static constexpr const char* kAttnName = "_amx_emulated";  // the attention kernels' label suffix
  struct alignas(64) Reg {
    unsigned char row[kTileRows][kTileBytes];
  };
  static Reg& reg(int t) {
    thread_local Reg regs[8];
    return regs[t];
  }
  static void configure() {}
  static void release() {}
  template <int T>
  static void zero() {
    std::memset(reg(T).row, 0, sizeof(Reg::row));
  }
  template <int T>
  static void load(const void* p, std::ptrdiff_t stride) {
    for (int r = 0; r < kTileRows; ++r)
      std::memcpy(reg(T).row[r], static_cast<const unsigned char*>(p) + r * stride, kTileBytes);
  }
  template <int T>
  static void store(void* p, std::ptrdiff_t stride) {
    for (int r = 0; r < kTileRows; ++r)
      std::memcpy(static_cast<unsigned char*>(p) + r * stride, reg(T).row[r], kTileBytes);
  }
  template <int C, int A, int B>
  static void dpbf16ps() {
    float c[kTileRows][kTileN];
    uint16_t a[kTileRows][kTileK], b[kTileRows][2 * kTileN];
    std::memcpy(c, reg(C).row, sizeof c);
    std::memcpy(a, reg(A).row, sizeof a);
    std::memcpy(b, reg(B).row, sizeof b);
    for (int m = 0; m < kTileRows; ++m)
      for (int k = 0; k < kTileK / 2; ++k)
        for (int n = 0; n < kTileN; ++n) {
          const float p0 = flush_denormal(make_fp32(a[m][2 * k]) * make_fp32(b[k][2 * n]));
          const float p1 = flush_denormal(make_fp32(a[m][2 * k + 1]) * make_fp32(b[k][2 * n + 1]));
          c[m][n] = flush_denormal(flush_denormal(c[m][n] + p0) + p1);
        }
    std::memcpy(reg(C).row, c, sizeof c);
  }
};

// The start-up probe: every tile operation once (configure, zero, load, two products, store,
// release) on fixed operands whose products round, tie and meet a bf16 denormal, so a CPU's
// tiles can be held to their emulation before the kernel runs on them (attention_amx.cpp).
struct ProbeIO {
  alignas(64) uint16_t a[kTileRows][kTileK];         // A: bf16 bits
  alignas(64) uint32_t b[2][kTileRows][kTileN];      // two B tiles, pair rows
  alignas(64) float c[kTileRows][kTileN];            // loaded into the second C tile
  alignas(64) float out[2][kTileRows][kTileN] = {};  // C tile 0 (zeroed first) and 1, after
  ProbeIO() {
    uint32_t x = 2463534242u;  // xorshift32: the operands are the same on every host
    auto next = [&x] { return x ^= x << 13, x ^= x >> 17, x ^= x << 5; };
    auto value = [&next] {  // a bf16 of either sign and any mantissa in [2^-8, 2^0)
      const uint32_t r = next();
      return uint16_t((r & 0x807fu) | (119u + (r >> 8) % 8) << 7);
    };
    for (auto& row : a)
      for (uint16_t& v : row) v = value();
    for (auto& tile : b)
      for (auto& row : tile)
        for (uint32_t& w : row) w = value() | uint32_t(value()) << 16;
    for (auto& row : c)
      for (float& v : row) v = float(int32_t(next() >> 8) - (1 << 23)) * 0x1p-20f;
    a[0][0] = 0x0001;  // a bf16 denormal: read as zero
  }
};
template <class Tiles>
void probe(ProbeIO& io) {
  constexpr std::ptrdiff_t kStride = kTileBytes;
  Tiles::configure();
  Tiles::template zero<0>();
  Tiles::template load<1>(io.c, kStride);
  Tiles::template load<4>(io.a, kStride);
  Tiles::template load<6>(io.b[0], kStride);
  Tiles::template load<7>(io.b[1], kStride);
  Tiles::template dpbf16ps<0, 4, 6>();
  Tiles::template dpbf16ps<1, 4, 7>();
  Tiles::template store<0>(io.out[0], kStride);
  Tiles::template store<1>(io.out[1], kStride);
  Tiles::release();
}

// "" when Tiles' probe runs and gives want's outputs (the emulation's) bit for bit, else why
// not: the signal a tile instruction raised, or how many values differ.
template <class Tiles>
std::string probe_check(const ProbeIO& want) {
  ProbeIO got;
  if (const int sig = run_catching_faults([](void* io) { probe<Tiles>(*static_cast<ProbeIO*>(io)); }, &got)) {
    run_catching_faults([](void*) { Tiles::release(); }, nullptr);  // a configuration left behind
    return std::string("the tile probe stopped with ") + fault_name(sig);
  }
  int differ = 0;
  for (int t = 0; t < 2; ++t)
    for (int r = 0; r < kTileRows; ++r) differ += std::memcmp(got.out[t][r], want.out[t][r], sizeof got.out[t][r]) != 0;
  return differ == 0 ? ""
                     : "the tile probe's products differ from the emulation in " + std::to_string(differ) + " of " +
                           std::to_string(2 * kTileRows) + " rows";
}

}  // namespace minicp::kernels::amx
