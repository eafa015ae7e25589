// Kernels for decode passes (1-16 tree nodes) on x86 CPUs: built with AVX512-BF16, a linear and an attention (bf16
// and fp32), the bf16 linear on AMX tiles where built with AMX too; built with AVX512F alone, the fp32 linear and
// attention; with AVX2 + FMA, the fp32 linear alone. Every build sums each fp32 output in the same order with the same
// fused multiply-adds: their results are equal bit for bit (the AMX build's bf16 sums are its own, row-invariant).
//
// y[M, N] = x[M, K] @ W[N, K]^T, fp32 accumulation (bf16: rounded to bf16 once, as oneDNN does). W is packed once,
// bf16 as [N/16, K/2, 16, 2] (one 64-byte load gives 16 output columns x 2 inputs, the operand of one
// vdpbf16ps), fp32 as [N/16, K, 16] (16 columns x 1 input, one FMA); every load of W serves all rows of the tile,
// so W streams through the cache once a call. An fp32 W dequantized from blocks of 32 inputs (GGUF Q4_1 / Q8_0) may
// be packed in that block form instead (4- or 8-bit q and fp32 d, m: 0.75-1.25 bytes a weight; see qgemm), the
// same products.
// Weights live in a registry under an integer key (the key a compiled graph bakes in), so the op takes
// no Python on its way: assistant_kernels::linear(x, key, n).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <vector>
#include <mutex>
#include <type_traits>
#include <unordered_map>

namespace {

std::mutex registry_mutex;
std::unordered_map<int64_t, at::Tensor> registry;

// While a task computes its group of columns it asks for the next group's W, each row tile for its share in
// proportion to its rows: a tile busy with 8 rows of vdpbf16ps left DRAM idle (the hardware prefetcher does not
// run far enough ahead of it), and a second row tile found its W in L2 with nothing to fetch. Every weight of
// SmolLM2 streamed once, machine E, 2 threads: 8 rows 9.1 -> 6.3 ms, 16 rows 11.5 -> 6.7 ms (1 row: 5.9). 1-3 rows
// are bound by the bytes alone and the extra instructions cost them 5-10%: they ask for none. The AVX2 build's block
// form (qgemm) asks at every row count: on a real AVX2 CPU (machine G, AMD EPYC, 2 threads, every SmolLM2 weight,
// interleaved with the build before) 1 row x0.78-0.85, 2-3 rows x0.90-0.93 (K18).
constexpr int64_t PREFETCH_MIN_ROWS = 4;

// Step i of a tile asks for bytes [i, i + 1) * ahead of p (ahead 0: none).
inline void ask_for(const char* p, int64_t i, int64_t ahead) {
  for (int64_t off = i * ahead; off < (i + 1) * ahead; off += 64) _mm_prefetch(p + off, _MM_HINT_T0);
}

// Calls f(std::integral_constant<int, n>) for a row count n of 1..8: the tiles below take their row count as a
// template argument so that their accumulators stay in registers (with a runtime count they lived on the stack:
// every FMA a load and a store, the attention ~3x slower).
template <class F>
inline void with_rows(int n, F&& f) {
  switch (n) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 5: f(std::integral_constant<int, 5>{}); break;
    case 6: f(std::integral_constant<int, 6>{}); break;
    case 7: f(std::integral_constant<int, 7>{}); break;
    default: f(std::integral_constant<int, 8>{}); break;
  }
}

// Calls f(std::integral_constant<int, n>) for a row count n of 1..N (the block form's tall tiles: up to 16 rows).
template <int N, class F>
inline void with_rows_upto(int n, F&& f) {
  if constexpr (N > 1) {
    if (n < N) return with_rows_upto<N - 1>(n, f);
  }
  f(std::integral_constant<int, N>{});
}

// The element types of the GEMM: every step of a tile reads 64 bytes of each block of W (bf16: 16 columns x
// 2 inputs for one vdpbf16ps; fp32: 16 columns x 1 input, one 512-bit FMA or two 256-bit ones) and broadcasts the
// rows' matching inputs into the accumulators of 16 columns (Acc). A tile takes MTILE rows at most and 1-2 blocks,
// or 4 where WIDE: 32 zmm hold 4 rows x 4 blocks; 16 ymm hold 3 rows x 2 blocks (12 accumulators; AVX2 at 16
// rows on SmolLM2's output layer: 3 x 2 tiles 3.9 ms, 2 x 2 4.6, 6 x 1 9.5, 1 x 4 4.9; machine E, 2 threads).
#if defined(__AVX512BF16__)
#define ASSISTANT_BF16 1
struct Bf16 {
  using T = uint16_t;
  using V = __m512bh;
  using Acc = __m512;
  static constexpr int64_t K_STEP = 2;          // inputs a step consumes
  static constexpr bool WIDE = true;
  static constexpr int64_t MTILE = 8;
  static Acc zero() { return _mm512_setzero_ps(); }
  static V w(const T* p) { return (V)_mm512_loadu_si512(p); }
  static V x(const T* row, int64_t s) { return (V)_mm512_set1_epi32(reinterpret_cast<const int32_t*>(row)[s]); }
  static __m512 fma(__m512 acc, V x, V w) { return _mm512_dpbf16_ps(acc, x, w); }
  static void store(T* y, __m512 acc) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y), (__m256i)_mm512_cvtneps_pbh(acc));
  }
};

#endif

#if defined(__AVX512F__)
struct F32 {
  using T = float;
  using V = __m512;
  using Acc = __m512;
  static constexpr int64_t K_STEP = 1;
  static constexpr bool WIDE = true;
  static constexpr int64_t MTILE = 8;
  static constexpr int64_t MTILE1 = 16;         // rows of a one-block tile (block form): 16 accumulators
  static constexpr int64_t ONE_BLOCK_FROM = 9;  // block form: rows from which one-block tiles take the rows,
  static constexpr int64_t ONE_BLOCK_TILES = 1; // and how many such tiles a block takes at most
  static Acc zero() { return _mm512_setzero_ps(); }
  static V w(const T* p) { return _mm512_loadu_ps(p); }
  static V x(const T* row, int64_t s) { return _mm512_set1_ps(row[s]); }
  static Acc fma(Acc acc, V x, V w) { return _mm512_fmadd_ps(x, w, acc); }
  static void store(T* y, Acc acc) { _mm512_storeu_ps(y, acc); }
  static Acc load(const T* y) { return _mm512_loadu_ps(y); }
  // 16 block-form weights: fl(fl(d * q) + m), the product rounded before the sum (no FMA), as the converter did
  static V dq(const int8_t* q, V d, V m) {
    __m512 p = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)q))));
    __asm__("" : "+v"(p));            // keeps the compiler from fusing the product into the sum
    return _mm512_add_ps(p, m);
  }
  // 16 weights of 4 bits: byte i holds column i (low nibble) and column i + 8 (high nibble)
  static V dq4(const int8_t* q, V d, V m) {
    const __m128i b = _mm_loadl_epi64((const __m128i*)q), low = _mm_set1_epi8(0x0F);
    const __m128i v = _mm_unpacklo_epi64(_mm_and_si128(b, low), _mm_and_si128(_mm_srli_epi16(b, 4), low));
    __m512 p = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v)));
    __asm__("" : "+v"(p));
    return _mm512_add_ps(p, m);
  }
};
#else
struct F32 {                                    // 16 columns as two halves of 8
  using T = float;
  struct V { __m256 lo, hi; };
  using Acc = V;
  static constexpr int64_t K_STEP = 1;
  static constexpr bool WIDE = false;
  static constexpr int64_t MTILE = 3;
  static constexpr int64_t MTILE1 = 6;          // one block: 12 accumulators, 2 weights, 1 broadcast
  static constexpr int64_t ONE_BLOCK_FROM = 2;  // 2-12 rows: one or two in-register tiles of one block (K20)
  static constexpr int64_t ONE_BLOCK_TILES = 2;
  static Acc zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static V w(const T* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  static V x(const T* row, int64_t s) {
    const __m256 b = _mm256_broadcast_ss(row + s);
    return {b, b};
  }
  static Acc fma(Acc acc, V x, V w) {
    return {_mm256_fmadd_ps(x.lo, w.lo, acc.lo), _mm256_fmadd_ps(x.hi, w.hi, acc.hi)};
  }
  static void store(T* y, Acc acc) {
    _mm256_storeu_ps(y, acc.lo);
    _mm256_storeu_ps(y + 8, acc.hi);
  }
  static Acc load(const T* y) { return {_mm256_loadu_ps(y), _mm256_loadu_ps(y + 8)}; }
  // fl(fl(d * q) + m) as ONE fused multiply-add: d is an fp16 value (11 significant bits) and |q| <= 127, so d * q
  // is exact in fp32 and the FMA's single rounding is the sum's, bit for bit; one instruction fewer per 8 weights
  // than the product and the sum (the AVX512 build keeps those: not measured there)
  static V dq(const int8_t* q, V d, V m) {
    const __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)q)));
    const __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(q + 8))));
    return {_mm256_fmadd_ps(d.lo, lo, m.lo), _mm256_fmadd_ps(d.hi, hi, m.hi)};
  }
  // the 8 bytes widened to 8 dwords once: the low nibbles masked off them, the high ones shifted down
  static V dq4(const int8_t* q, V d, V m) {
    const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)q));
    const __m256 lo = _mm256_cvtepi32_ps(_mm256_and_si256(b, _mm256_set1_epi32(0x0F)));
    const __m256 hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
    return {_mm256_fmadd_ps(d.lo, lo, m.lo), _mm256_fmadd_ps(d.hi, hi, m.hi)};
  }
};
#endif

// MT rows x NB blocks of 16 columns over `steps` steps; w points at the first block, blocks are steps * 64 bytes
// apart. Step s also asks for the bytes [s, s + 1) * ahead of pf (ahead 0: none). ADD (fp32 only) goes on from
// the partial sums in y instead of zero: an fp32 store and load are exact, so a sum taken in pieces is the same.
template <class E, int MT, int NB, bool ADD = false>
inline void tile(const typename E::T* __restrict x, int64_t K, const typename E::T* __restrict w, int64_t steps,
                 typename E::T* __restrict y, int64_t N, const char* pf, int64_t ahead) {
  constexpr int64_t PER = 64 / sizeof(typename E::T);      // elements of a block a step reads
  typename E::Acc acc[MT][NB];
  // unrolled by hand where GCC would not: an AVX2 accumulator is two ymm, and at 4-6 rows GCC left the loops
  // rolled, the accumulators in memory (6-row chunk tiles x2.2 slower; machine G, K19)
#pragma GCC unroll 16
  for (int i = 0; i < MT; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) {
      if constexpr (ADD) acc[i][j] = E::load(y + i * N + j * 16);
      else acc[i][j] = E::zero();
    }
  const int64_t block = steps * PER;
  for (int64_t s = 0; s < steps; ++s) {
    ask_for(pf, s, ahead);
    typename E::V wv[NB];
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) wv[j] = E::w(w + j * block + s * PER);
#pragma GCC unroll 16
    for (int i = 0; i < MT; ++i) {
      const typename E::V xv = E::x(x + i * K, s);
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) acc[i][j] = E::fma(acc[i][j], xv, wv[j]);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MT; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) E::store(y + i * N + j * 16, acc[i][j]);
}

template <class E, int NB>
void rows(int m, const typename E::T* x, int64_t K, const typename E::T* w, int64_t steps, typename E::T* y, int64_t N,
          const char* pf, int64_t ahead) {
  with_rows(m, [&](auto r) { tile<E, decltype(r)::value, NB>(x, K, w, steps, y, N, pf, ahead); });
}

constexpr int64_t GROUP = 4;   // blocks of 16 columns a task takes: 64 columns, <= 196 KB of bf16 W at K = 1536

// The blocks a task takes: GROUP or fewer, whichever gives the busiest thread the fewest blocks (ties: the larger).
// A 576-column weight (SmolLM2's o and down projections) is 36 blocks: 9 groups of 4 give one of 2 threads 5 and
// the other 4, idle a fifth of the product; 12 groups of 3 give each 6.
inline int64_t group_size(int64_t blocks) {
  const int64_t threads = std::max<int64_t>(at::get_num_threads(), 1);
  int64_t best = GROUP, least = INT64_MAX;
  for (int64_t g = GROUP; g >= 1; --g) {
    const int64_t groups = (blocks + g - 1) / g, busiest = std::min(blocks, (groups + threads - 1) / threads * g);
    if (busiest < least) best = g, least = busiest;
  }
  return best;
}

template <class E>
void gemm(const typename E::T* xp, int64_t M, int64_t K, const typename E::T* w, int64_t steps, int64_t blocks,
          typename E::T* yp, int64_t n) {
  constexpr int64_t PER = 64 / sizeof(typename E::T);
  const int64_t group = group_size(blocks), groups = (blocks + group - 1) / group;
  at::parallel_for(0, groups, 1, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t b0 = g * group, nb = std::min<int64_t>(group, blocks - b0);
      const typename E::T* wb = w + b0 * steps * PER;
      // the next group starts where this one ends; a prefetch past the weight's end never faults
      const char* next = reinterpret_cast<const char*>(wb + nb * steps * PER);
      const bool fetch = M >= PREFETCH_MIN_ROWS && g + 1 < groups;
      for (int64_t m0 = 0; m0 < M; m0 += E::MTILE) {
        const int m = static_cast<int>(std::min<int64_t>(E::MTILE, M - m0));
        const typename E::T* xm = xp + m0 * K;
        typename E::T* ym = yp + m0 * n + b0 * 16;
        // this tile's share of the next group: m / M of every block, `steps` steps of `per_block` bytes each
        const int64_t per_block = fetch ? 64 * m / M : 0;
        const char* pf = next + m0 * nb * steps * 64 / M;
        if constexpr (E::WIDE) {        // 4-block tiles only where they fit the registers (not built else)
          if (nb == 4 && m <= 4) {
            rows<E, 4>(m, xm, K, wb, steps, ym, n, pf, 4 * per_block);
            continue;
          }
        }
        int64_t b = 0;
        for (; b + 2 <= nb; b += 2)
          rows<E, 2>(m, xm, K, wb + b * steps * PER, steps, ym + b * 16, n, pf + b * steps * per_block, 2 * per_block);
        if (b < nb)
          rows<E, 1>(m, xm, K, wb + b * steps * PER, steps, ym + b * 16, n, pf + b * steps * per_block, per_block);
      }
    }
  });
}

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(ASSISTANT_BF16)
// The bf16 linear on AMX (the "amx" build): one TDPBF16PS multiplies a tile of up to 16 rows x 32 inputs by the
// 32 inputs x 16 columns of one block-step of W, which the bf16 packing already lays out as AMX wants it (16
// k-pairs of 64 bytes, one after another). vdpbf16ps does 16 columns x 2 inputs a row per instruction, so at 8-16
// rows the vector loop is bound by its multiplies, not by W's bytes (machine F, Xeon with AMX, 2 threads: the
// 49152x576 output layer 1.05 ms at 1 row, 4.2 ms at 16; BENCHMARKS.md K14); the tiles do 16 rows in about the time
// of one. Every output is summed in the same order at every row count (one accumulator tile a block, the steps in
// turn), so a verify pass stays row-invariant. The build takes AMX for every weight with K % 32 == 0 (decided by the shape,
// never by the row count); others, and a process the kernel does not let use AMX, take the vector loop.
#define ASSISTANT_AMX 1
#include <sys/syscall.h>
#include <unistd.h>

bool amx_ready() {
  static const bool ok = [] {
    constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
  }();
  return ok;
}

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// m <= 16 rows, tiles 0-3: C (m rows x 16 fp32) of 4 blocks; 4: A (m rows x 32 bf16); 5-7: B (16 k-pairs x 16
// columns x 2). m = 16 + m2 rows (17-32): C of 2 blocks for each half (0-1: the first 16 rows, 2-3: the other m2),
// A of each half (4, 5), B of 2 blocks (6, 7): every B tile loaded serves both halves, so 32 rows cost about what 16
// do (one pass over W), where two 16-row passes read W twice.
inline void amx_config(int m) {
  TileConfig c;
  const int m1 = std::min(m, 16), m2 = m - m1;
  for (int t = 0; t < 8; ++t) c.colsb[t] = 64;
  if (m2 == 0) {
    for (int t = 0; t < 5; ++t) c.rows[t] = static_cast<uint8_t>(m1);
    for (int t = 5; t < 8; ++t) c.rows[t] = 16;
  } else {
    c.rows[0] = c.rows[1] = c.rows[4] = 16;
    c.rows[2] = c.rows[3] = c.rows[5] = static_cast<uint8_t>(m2);
    c.rows[6] = c.rows[7] = 16;
  }
  _tile_loadconfig(&c);
}

// NB (1-4) blocks of 16 columns for the m <= 16 rows configured: w points at the first block (blocks `block`
// elements apart, 512 elements a step), out gets m rows x NB * 16 fp32 (stride 64 floats)
template <int NB>
inline void amx_tile(const uint16_t* x, int64_t K, const uint16_t* w, int64_t steps, int64_t block, float* out) {
  _tile_zero(0);
  if constexpr (NB > 1) _tile_zero(1);
  if constexpr (NB > 2) _tile_zero(2);
  if constexpr (NB > 3) _tile_zero(3);
  for (int64_t s = 0; s < steps; ++s) {
    const uint16_t* ws = w + s * 512;
    _tile_loadd(4, x + s * 32, K * 2);
    _tile_loadd(5, ws, 64);
    _tile_dpbf16ps(0, 4, 5);
    if constexpr (NB > 1) { _tile_loadd(6, ws + block, 64); _tile_dpbf16ps(1, 4, 6); }
    if constexpr (NB > 2) { _tile_loadd(7, ws + 2 * block, 64); _tile_dpbf16ps(2, 4, 7); }
    if constexpr (NB > 3) { _tile_loadd(5, ws + 3 * block, 64); _tile_dpbf16ps(3, 4, 5); }
  }
  _tile_stored(0, out, 256);
  if constexpr (NB > 1) _tile_stored(1, out + 16, 256);
  if constexpr (NB > 2) _tile_stored(2, out + 32, 256);
  if constexpr (NB > 3) _tile_stored(3, out + 48, 256);
}

// NB (1-2) blocks for the 16 + m2 rows configured (two halves sharing each B tile); out: 32 rows x 64 fp32
template <int NB>
inline void amx_tile2(const uint16_t* x, int64_t K, const uint16_t* w, int64_t steps, int64_t block, float* out) {
  _tile_zero(0);
  _tile_zero(2);
  if constexpr (NB > 1) { _tile_zero(1); _tile_zero(3); }
  for (int64_t s = 0; s < steps; ++s) {
    const uint16_t* ws = w + s * 512;
    _tile_loadd(4, x + s * 32, K * 2);
    _tile_loadd(5, x + 16 * K + s * 32, K * 2);
    _tile_loadd(6, ws, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(2, 5, 6);
    if constexpr (NB > 1) {
      _tile_loadd(7, ws + block, 64);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, out, 256);
  _tile_stored(2, out + 16 * 64, 256);
  if constexpr (NB > 1) { _tile_stored(1, out + 16, 256); _tile_stored(3, out + 16 * 64 + 16, 256); }
}

void amx_gemm(const uint16_t* xp, int64_t M, int64_t K, const uint16_t* w, int64_t blocks, uint16_t* yp, int64_t n) {
  const int64_t steps = K / 32, block = K * 16, group = group_size(blocks), groups = (blocks + group - 1) / group;
  at::parallel_for(0, groups, 1, [&](int64_t g0, int64_t g1) {
    alignas(64) float out[32 * 64];
    int configured = 0;
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t b0 = g * group, nb = std::min<int64_t>(group, blocks - b0);
      const uint16_t* wb = w + b0 * block;
      for (int64_t m0 = 0; m0 < M; m0 += 32) {
        const int m = static_cast<int>(std::min<int64_t>(32, M - m0));
        if (m != configured) amx_config(configured = m);
        const uint16_t* xm = xp + m0 * K;
        if (m <= 16) {
          switch (nb) {
            case 1: amx_tile<1>(xm, K, wb, steps, block, out); break;
            case 2: amx_tile<2>(xm, K, wb, steps, block, out); break;
            case 3: amx_tile<3>(xm, K, wb, steps, block, out); break;
            default: amx_tile<4>(xm, K, wb, steps, block, out); break;
          }
        } else {
          for (int64_t b = 0; b < nb; b += 2) {
            float* o = out + b * 16;
            if (nb - b >= 2) amx_tile2<2>(xm, K, wb + b * block, steps, block, o);
            else amx_tile2<1>(xm, K, wb + b * block, steps, block, o);
          }
        }
        for (int i = 0; i < m; ++i)
          for (int64_t j = 0; j < nb; ++j)
            Bf16::store(yp + (m0 + i) * n + (b0 + j) * 16, _mm512_load_ps(out + i * 64 + j * 16));
      }
    }
    if (configured) _tile_release();
  });
}
#endif

// Block form of an fp32 weight that was dequantized from 32-input blocks (GGUF Q4_1: w = fl(fl(d * q) + m), q in
// 0..15; Q8_0: w = fl(d * q), q in -127..127, m = 0): per 16 columns, K steps of q (Q = 8 bytes a step, two q of
// 4 bits a byte, where every q is 0..15; else Q = 16, one int8 each) then, per 32 inputs, 16 fp32 d and 16 fp32 m.
// Each step rebuilds the fp32 weights bit for bit and runs the fp32 tile's FMAs in the fp32 tile's order, so the
// product equals the fp32 kernel's bit for bit, from 0.75 (or 1.25) bytes a weight instead of 4.
constexpr int64_t QBLOCK = 32;

inline int64_t qrow_bytes(int64_t K, int64_t Q) { return K * Q + (K / QBLOCK) * 16 * 8; }

template <int Q>
inline F32::V dequant(const int8_t* q, F32::V d, F32::V m) {
  if constexpr (Q == 8) return F32::dq4(q, d, m);
  else return F32::dq(q, d, m);
}

template <int Q, int MT, int NB>
inline void qtile(const float* __restrict x, int64_t K, const int8_t* __restrict w, int64_t rb, float* __restrict y,
                  int64_t N, const char* pf, int64_t ahead) {
  F32::Acc acc[MT][NB];
#pragma GCC unroll 16
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < NB; ++j) acc[i][j] = F32::zero();
  for (int64_t g = 0; g < K / QBLOCK; ++g) {
    ask_for(pf, g, ahead);
    F32::V d[NB], m[NB];
    for (int j = 0; j < NB; ++j) {
      const float* sc = reinterpret_cast<const float*>(w + j * rb + K * Q) + g * 32;
      d[j] = F32::w(sc);
      m[j] = F32::w(sc + 16);
    }
    for (int64_t s = g * QBLOCK; s < (g + 1) * QBLOCK; ++s) {
      F32::V wv[NB];
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) wv[j] = dequant<Q>(w + j * rb + s * Q, d[j], m[j]);
#pragma GCC unroll 16
      for (int i = 0; i < MT; ++i) {
        const F32::V xv = F32::x(x + i * K, s);
#pragma GCC unroll 4
        for (int j = 0; j < NB; ++j) acc[i][j] = F32::fma(acc[i][j], xv, wv[j]);
      }
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < NB; ++j) F32::store(y + i * N + j * 16, acc[i][j]);
}

// MT rows x NB blocks over one chunk of 32 steps whose weights were rebuilt into buf ([NB][32][16] fp32: the fp32
// packing of those steps), from zero on the first chunk and from y's partial sums after it. Where a tile holds few
// rows (AVX2: 3), the rows share one rebuild this way.
template <int MT, int NB>
inline void chunk_tile(const float* x, int64_t K, const float* buf, float* y, int64_t N, bool first) {
  if (first) tile<F32, MT, NB>(x, K, buf, QBLOCK, y, N, nullptr, 0);
  else tile<F32, MT, NB, true>(x, K, buf, QBLOCK, y, N, nullptr, 0);
}

template <int Q, int NB>
void qrows(int m, const float* x, int64_t K, const int8_t* w, int64_t rb, float* y, int64_t N, const char* pf,
           int64_t ahead) {
  with_rows(m, [&](auto r) { qtile<Q, decltype(r)::value, NB>(x, K, w, rb, y, N, pf, ahead); });
}

template <int Q>
void qgemm(const float* xp, int64_t M, int64_t K, const int8_t* w, int64_t blocks, float* yp, int64_t n) {
  const int64_t rb = qrow_bytes(K, Q), group = group_size(blocks), groups = (blocks + group - 1) / group;
  at::parallel_for(0, groups, 1, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t b0 = g * group, nb = std::min<int64_t>(group, blocks - b0);
      const int8_t* wb = w + b0 * rb;
      const char* next = reinterpret_cast<const char*>(wb + nb * rb);
      const bool fetch = (M >= PREFETCH_MIN_ROWS || !F32::WIDE) && g + 1 < groups;
      const int64_t tiles = (M + F32::MTILE1 - 1) / F32::MTILE1;
      if (M >= F32::ONE_BLOCK_FROM && tiles <= F32::ONE_BLOCK_TILES) {
        // the rows in in-register tiles of one block, evenly filled (AVX512 9-16 rows: one tile, so each weight
        // is rebuilt once; AVX2 2-6 rows one, 7-12 two, each rebuilding the block from L1: on machine G x0.75 at
        // 3 rows and x0.90-0.94 at 7-10 against the 2-block and chunked tiles, K19/K20)
        const int64_t ahead = fetch ? rb / (K / QBLOCK) : 0;
        for (int64_t b = 0; b < nb; ++b)
          for (int64_t t = 0, m0 = 0; t < tiles; ++t) {
            const int m = static_cast<int>(M / tiles + (t < M % tiles));
            with_rows_upto<F32::MTILE1>(m, [&](auto r) {
              qtile<Q, decltype(r)::value, 1>(xp + m0 * K, K, wb + b * rb, rb, yp + m0 * n + b0 * 16 + b * 16, n,
                                              next + b * rb, t == 0 ? ahead : 0);
            });
            m0 += m;
          }
        continue;
      }
      if constexpr (!F32::WIDE) {
        if (M > F32::MTILE1) {
          // more rows than that (AVX2 13+): each chunk of 32 steps rebuilt once into L1, then every row tile (as
          // many of one block as the rows need, evenly filled) reads it; each chunk asks for its share of the next
          // group's bytes (K18, K19)
          alignas(64) float buf[GROUP * QBLOCK * 16];
          const int64_t ahead = fetch ? nb * rb / (K / QBLOCK) : 0, tiles = (M + F32::MTILE1 - 1) / F32::MTILE1;
          for (int64_t c = 0; c < K / QBLOCK; ++c) {
            ask_for(next, c, ahead);
            for (int64_t j = 0; j < nb; ++j) {
              const float* sc = reinterpret_cast<const float*>(wb + j * rb + K * Q) + c * 32;
              const F32::V d = F32::w(sc), mm = F32::w(sc + 16);
              for (int64_t s = 0; s < QBLOCK; ++s)
                F32::store(buf + (j * QBLOCK + s) * 16, dequant<Q>(wb + j * rb + (c * QBLOCK + s) * Q, d, mm));
            }
            for (int64_t t = 0, m0 = 0; t < tiles; ++t) {
              const int m = static_cast<int>(M / tiles + (t < M % tiles));
              for (int64_t b = 0; b < nb; ++b)
                with_rows_upto<F32::MTILE1>(m, [&](auto r) {
                  chunk_tile<decltype(r)::value, 1>(xp + m0 * K + c * QBLOCK, K, buf + b * QBLOCK * 16,
                                                    yp + m0 * n + b0 * 16 + b * 16, n, c == 0);
                });
              m0 += m;
            }
          }
          continue;
        }
      }
      for (int64_t m0 = 0; m0 < M; m0 += F32::MTILE) {
        const int m = static_cast<int>(std::min<int64_t>(F32::MTILE, M - m0));
        const float* xm = xp + m0 * K;
        float* ym = yp + m0 * n + b0 * 16;
        // this tile's share of the next group's bytes, spread over its K / 32 groups of steps
        const int64_t share = fetch ? nb * rb * m / M : 0, ahead = share / (K / QBLOCK);
        const char* pf = next + m0 * nb * rb / M;
        if constexpr (F32::WIDE) {
          if (nb == 4 && m <= 4) {
            qrows<Q, 4>(m, xm, K, wb, rb, ym, n, pf, ahead);
            continue;
          }
        }
        int64_t b = 0;
        const int64_t part = ahead / std::max<int64_t>(nb, 1);
        for (; b + 2 <= nb; b += 2)
          qrows<Q, 2>(m, xm, K, wb + b * rb, rb, ym + b * 16, n, pf + b * part * (K / QBLOCK), 2 * part);
        if (b < nb) qrows<Q, 1>(m, xm, K, wb + b * rb, rb, ym + b * 16, n, pf + b * part * (K / QBLOCK), part);
      }
    }
  });
}

// One block of 32 weights in block form, if it has one: q and (d, m) with fl(fl(d * q) + m) == w bit for bit for
// every weight. GGUF Q4_1 first (m the block's least weight, d an fp16 value near (max - min) / 15, q 0..15), then
// Q8_0 (m 0, d near max |w| / 127, q -127..127); a few fp16 values around the estimate are tried.
inline bool find_block(const float* w, int8_t* q, float& d_out, float& m_out) {
  float lo = w[0], hi = w[0];
  for (int i = 1; i < QBLOCK; ++i) lo = std::min(lo, w[i]), hi = std::max(hi, w[i]);
  if (!std::isfinite(lo) || !std::isfinite(hi)) return false;
  static const int steps[] = {0, 1, -1, 2, -2};
  for (int kind = 0; kind < 2; ++kind) {
    const float m = kind == 0 ? lo : 0.0f;
    const int qlo = kind == 0 ? 0 : -127, qhi = kind == 0 ? 15 : 127;
    const float est = kind == 0 ? (hi - lo) / 15.0f : std::max(std::fabs(lo), std::fabs(hi)) / 127.0f;
    const uint16_t h = c10::Half(est).x;          // the fp16 value nearest the estimate
    for (int step : steps) {
      const float d = static_cast<float>(c10::Half(static_cast<uint16_t>(h + step), c10::Half::from_bits()));
      if (!std::isfinite(d)) continue;
      bool ok = true;
      for (int i = 0; i < QBLOCK && ok; ++i) {
        float r = d != 0.0f ? std::nearbyint((w[i] - m) / d) : 0.0f;
        r = std::min(std::max(r, static_cast<float>(qlo)), static_cast<float>(qhi));
        volatile float p = d * r;                  // rounded before the sum, as the converter did
        const float v = p + m;
        uint32_t a, b;
        std::memcpy(&a, &v, 4);
        std::memcpy(&b, &w[i], 4);
        ok = a == b;
        q[i] = static_cast<int8_t>(r);
      }
      if (ok) {
        d_out = d, m_out = m;
        return true;
      }
    }
  }
  return false;
}

// An fp32 [N, K] weight (N % 16 == 0, K % 32 == 0) in block form, packed [N/16, qrow_bytes(K, Q)] int8 for qgemm
// (Q = 8 where every q is 0..15, else 16); an empty tensor when some block has none.
at::Tensor pack_blocks(const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kFloat && w.size(0) % 16 == 0 && w.size(1) % QBLOCK == 0,
              "assistant_kernels::pack_blocks: an fp32 [N, K] weight with N % 16 == 0 and K % 32 == 0 expected");
  const at::Tensor wc = w.contiguous();
  const int64_t N = wc.size(0), K = wc.size(1), G = K / QBLOCK;
  std::vector<int8_t> q(N * K);
  std::vector<float> d(N * G), m(N * G);
  std::atomic<bool> ok{true}, wide{false};
  const float* src = wc.data_ptr<float>();
  at::parallel_for(0, N, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1 && ok.load(std::memory_order_relaxed); ++r)
      for (int64_t g = 0; g < G; ++g) {
        int8_t* qb = q.data() + r * K + g * QBLOCK;
        if (!find_block(src + r * K + g * QBLOCK, qb, d[r * G + g], m[r * G + g])) {
          ok = false;
          return;
        }
        for (int i = 0; i < QBLOCK; ++i)
          if (qb[i] < 0 || qb[i] > 15) wide = true;
      }
  });
  if (!ok) return at::empty({0}, wc.options().dtype(at::kChar));
  const int64_t Q = wide ? 16 : 8, rb = qrow_bytes(K, Q);
  at::Tensor out = at::empty({N / 16, rb}, wc.options().dtype(at::kChar));
  int8_t* dst = out.data_ptr<int8_t>();
  at::parallel_for(0, N / 16, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      int8_t* row = dst + b * rb;
      float* sc = reinterpret_cast<float*>(row + K * Q);
      for (int64_t k = 0; k < K; ++k)
        for (int c = 0; c < 16; ++c) {
          const int8_t v = q[(b * 16 + c) * K + k];
          if (Q == 16) row[k * 16 + c] = v;
          else if (c < 8) row[k * 8 + c] = v;
          else row[k * 8 + c - 8] = static_cast<int8_t>(row[k * 8 + c - 8] | (v << 4));
        }
      for (int64_t g = 0; g < G; ++g)
        for (int c = 0; c < 16; ++c) {
          sc[g * 32 + c] = d[(b * 16 + c) * G + g];
          sc[g * 32 + 16 + c] = m[(b * 16 + c) * G + g];
        }
    }
  });
  return out;
}

// bf16 W packed [N/16, K/2, 16, 2]; fp32 W packed [N/16, K, 16]
at::Tensor linear_packed(const at::Tensor& x, const at::Tensor& wp, int64_t n) {
  if (wp.scalar_type() == at::kChar) {          // block form: [N/16, qrow_bytes(K, 8 or 16)] int8
    TORCH_CHECK(x.scalar_type() == at::kFloat && wp.dim() == 2 && n == wp.size(0) * 16,
                "assistant_kernels::linear: an fp32 input and a block-form weight expected");
    const at::Tensor xc = x.contiguous();
    const int64_t K = xc.size(-1);
    const bool nibbles = wp.size(1) == qrow_bytes(K, 8);
    TORCH_CHECK(K % QBLOCK == 0 && (nibbles || wp.size(1) == qrow_bytes(K, 16)),
                "assistant_kernels::linear: shapes do not match the block-form weight");
    const int64_t M = K ? xc.numel() / K : 0;
    std::vector<int64_t> sizes = xc.sizes().vec();
    sizes.back() = n;
    at::Tensor y = at::empty(sizes, xc.options());
    if (nibbles) qgemm<8>(xc.data_ptr<float>(), M, K, wp.data_ptr<int8_t>(), wp.size(0), y.data_ptr<float>(), n);
    else qgemm<16>(xc.data_ptr<float>(), M, K, wp.data_ptr<int8_t>(), wp.size(0), y.data_ptr<float>(), n);
    return y;
  }
  const bool bf16 = wp.scalar_type() == at::kBFloat16 && wp.dim() == 4;
  TORCH_CHECK((bf16 && x.scalar_type() == at::kBFloat16) ||
              (wp.scalar_type() == at::kFloat && wp.dim() == 3 && x.scalar_type() == at::kFloat),
              "assistant_kernels::linear: a bf16 or fp32 input and a packed weight of its dtype expected");
  const at::Tensor xc = x.contiguous();
  const int64_t K = xc.size(-1), steps = wp.size(1), blocks = wp.size(0);
  TORCH_CHECK(K == steps * (bf16 ? 2 : F32::K_STEP) && n == blocks * 16,
              "assistant_kernels::linear: shapes do not match the packed weight");
  const int64_t M = K ? xc.numel() / K : 0;
  std::vector<int64_t> sizes = xc.sizes().vec();
  sizes.back() = n;
  at::Tensor y = at::empty(sizes, xc.options());
  if (bf16) {
#ifdef ASSISTANT_BF16
#ifdef ASSISTANT_AMX
    if (K % 32 == 0 && amx_ready()) {
      amx_gemm(reinterpret_cast<const uint16_t*>(xc.data_ptr()), M, K, reinterpret_cast<const uint16_t*>(wp.data_ptr()),
               blocks, reinterpret_cast<uint16_t*>(y.data_ptr()), n);
      return y;
    }
#endif
    gemm<Bf16>(reinterpret_cast<const uint16_t*>(xc.data_ptr()), M, K, reinterpret_cast<const uint16_t*>(wp.data_ptr()),
               steps, blocks, reinterpret_cast<uint16_t*>(y.data_ptr()), n);
#else
    TORCH_CHECK(false, "assistant_kernels::linear: this build (no AVX512-BF16) has no bf16 kernel");
#endif
  } else
    gemm<F32>(xc.data_ptr<float>(), M, K, wp.data_ptr<float>(), steps, blocks, y.data_ptr<float>(), n);
  return y;
}

at::Tensor linear(const at::Tensor& x, int64_t key, int64_t n) {
  at::Tensor w;
  {
    std::lock_guard<std::mutex> lock(registry_mutex);
    auto it = registry.find(key);
    TORCH_CHECK(it != registry.end(), "assistant_kernels::linear: no weight registered under key ", key);
    w = it->second;
  }
  return linear_packed(x, w, n);
}

// e^x as Cephes' expf (~1 ulp), the attention's softmax in every build: x clamped to [-87, 88] (0 below: a masked
// score), n = round(x log2 e), r = x - n ln 2 (ln 2 in two parts), e^r = 1 + r + r^2 (EXP_POLY in r, Horner),
// times 2^n.
constexpr float EXP_LO = -87.0f, EXP_HI = 88.0f, EXP_LOG2E = 1.44269504088896341f, EXP_LN2_HI = 0.693359375f,
                EXP_LN2_LO = -2.12194440e-4f;
constexpr float EXP_POLY[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                               4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
// A score at or below this is a hidden slot's: the engines' masks add the dtype's min (-3.4e38), a seen slot's
// score is a scaled dot product, far above it.
constexpr float MASKED = -1e30f;
constexpr int64_t RTILE = 8;      // query rows whose scores (AVX512: and outputs) a tile keeps in registers
constexpr int64_t TASK_ROWS = 64; // most query rows a task takes: its scores (rows x slots, fp32) stay small
constexpr int64_t MAXD = 256;     // the largest head dimension the attention takes

#if defined(__AVX512F__)
inline __m512 exp16(__m512 x) {
  const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(EXP_LO), _CMP_GE_OQ);
  x = _mm512_min_ps(x, _mm512_set1_ps(EXP_HI));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(EXP_LOG2E)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_LN2_HI), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_LN2_LO), r);
  __m512 p = _mm512_set1_ps(EXP_POLY[0]);
  for (int i = 1; i < 6; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_POLY[i]));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_maskz_mov_ps(live, _mm512_scalef_ps(p, n));
}

inline __mmask16 first_lanes(int64_t n) {   // the first min(n, 16) of 16 lanes
  return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1);
}

// r[i] lane j <- r[j] lane i, for 16 x 16 32-bit elements (unpack 32, unpack 64, then two 128-bit lane shuffles).
inline void transpose16(__m512i r[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 16; i += 8)
    for (int j = 0; j < 4; ++j) {
      t[i + j] = _mm512_shuffle_i32x4(u[i + j], u[i + j + 4], 0x88);
      t[i + j + 4] = _mm512_shuffle_i32x4(u[i + j], u[i + j + 4], 0xdd);
    }
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0x88);
    r[j + 8] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0xdd);
  }
}

// The softmax denominator of one query row, summed in 16 lanes by the RANK of each slot among the slots the row
// sees (its masked score above MASKED), not by the slot's place in the window: a tree node's ancestors sit at
// scattered slots, but in the one-node pass that later reads the same keys they are consecutive; with lanes by rank
// both add the same terms in the same order, so every row's attention, and so the whole verify pass (the linears
// and the compiled elementwise code are row-invariant already), gives each node bit for bit what a one-token pass
// gives it, and speculative decoding answers exactly what greedy decoding on this engine answers (bf16, fp32). A
// block whose 16 slots are all seen while the lanes are aligned is one vector add, as before; only blocks with
// masked slots (a tree's, a prefill chunk's causal edge) take the compress-and-rotate path.
struct RankSum {
  __m512 sum = _mm512_setzero_ps(), buf = _mm512_setzero_ps();
  int fill = 0;                    // seen slots so far, mod 16: the lane the next one goes to

  void add(__m512 e, __mmask16 seen) {
    if (seen == 0xFFFF && fill == 0) {
      sum = _mm512_add_ps(sum, e);
      return;
    }
    const int k = __builtin_popcount(seen);
    if (k == 0) return;
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    // the seen terms packed into lanes 0..k-1, then rotated so that term i lands in lane (fill + i) % 16
    const __m512 rot = _mm512_permutexvar_ps(
        _mm512_and_si512(_mm512_sub_epi32(lane, _mm512_set1_epi32(fill)), _mm512_set1_epi32(15)),
        _mm512_maskz_compress_ps(seen, e));
    const int end = fill + k;
    const __mmask16 from = (__mmask16)(0xFFFFu << fill);
    if (end < 16) {
      buf = _mm512_mask_mov_ps(buf, from & first_lanes(end), rot);
      fill = end;
    } else {
      sum = _mm512_add_ps(sum, _mm512_mask_mov_ps(buf, from, rot));
      buf = _mm512_maskz_mov_ps(first_lanes(end - 16), rot);
      fill = end - 16;
    }
  }

  float total() const { return _mm512_reduce_add_ps(_mm512_add_ps(sum, buf)); }
};

// The attention's element types: bf16 (keys as d-pairs, one vdpbf16ps per pair of dimensions) and fp32 (one
// FMA per dimension). A "unit" is one 32-bit lane of a key row: a d-pair of bf16, or one fp32 value.
struct AttnF32 {
  using T = float;
  static constexpr int64_t PER = 1;     // dimensions per unit
  static __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
  static void store32(float* out, __m512 lo, __m512 hi) {
    _mm512_storeu_ps(out, lo);
    _mm512_storeu_ps(out + 16, hi);
  }
};
#ifdef ASSISTANT_BF16
struct AttnBf16 {
  using T = uint16_t;
  static constexpr int64_t PER = 2;
  static __m512 load16(const uint16_t* p) {     // 16 bf16 -> fp32
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
  }
  static void store32(uint16_t* out, __m512 lo, __m512 hi) {
    _mm256_storeu_si256((__m256i*)out, (__m256i)_mm512_cvtneps_pbh(lo));
    _mm256_storeu_si256((__m256i*)(out + 16), (__m256i)_mm512_cvtneps_pbh(hi));
  }
};
#endif

// Scores of R query rows against 16 slots: kt holds the slots' keys as U units (transposed), qrow[r] the rows'
// units; scaled, masked (mrow[r] + j0) and stored to score[r] + j0 for the live lanes. Each score sums its
// dimensions in one order whatever slot it is in.
template <class E, int R>
inline void score_tile(const __m512i* kt, int64_t U, const int32_t* const* qrow, const float* const* mrow,
                       float* const* score, int64_t j0, __mmask16 live, __m512 vscale) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t u = 0; u < U; ++u) {
#ifdef ASSISTANT_BF16
    if constexpr (std::is_same_v<E, AttnBf16>) {
      const __m512bh kv = (__m512bh)kt[u];
      for (int r = 0; r < R; ++r) acc[r] = _mm512_dpbf16_ps(acc[r], (__m512bh)_mm512_set1_epi32(qrow[r][u]), kv);
      continue;
    }
#endif
    const __m512 kv = _mm512_castsi512_ps(kt[u]);
    for (int r = 0; r < R; ++r)
      acc[r] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_set1_epi32(qrow[r][u])), kv, acc[r]);
  }
  for (int r = 0; r < R; ++r)
    _mm512_mask_storeu_ps(score[r] + j0, live,
                          _mm512_fmadd_ps(acc[r], vscale, _mm512_maskz_loadu_ps(live, mrow[r] + j0)));
}

// out[r][0:32] = sum_j prob[r][j] * v[j][0:32] * inv[r] for R rows over N slots (v rows `vstride` apart), in
// slot order (a hidden slot's probability is 0, which adds nothing).
template <class E, int R>
inline void value_tile(const float* const* prob, const float* inv, const typename E::T* v, int64_t vstride, int64_t N,
                       typename E::T* const* out) {
  __m512 o0[R], o1[R];
  for (int r = 0; r < R; ++r) o0[r] = o1[r] = _mm512_setzero_ps();
  for (int64_t j = 0; j < N; ++j) {
    const __m512 v0 = E::load16(v + j * vstride), v1 = E::load16(v + j * vstride + 16);
    for (int r = 0; r < R; ++r) {
      const __m512 p = _mm512_set1_ps(prob[r][j]);
      o0[r] = _mm512_fmadd_ps(p, v0, o0[r]);
      o1[r] = _mm512_fmadd_ps(p, v1, o1[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    const __m512 s = _mm512_set1_ps(inv[r]);
    E::store32(out[r], _mm512_mul_ps(o0[r], s), _mm512_mul_ps(o1[r], s));
  }
}

// Attention of query rows over a window of the cache (a tree's nodes, or a prompt's chunk): q [B, H, Q, D],
// k/v [B, KVH, N, D], mask [B or 1, 1, Q, N] additive -> [B, Q, H, D], bf16 or fp32 (q, k, v and the output alike).
// A task takes one kv head and half of its grouped query rows (G * Q; at most TASK_ROWS), so each key and value is
// read by two tasks of a decode pass, not by every query head. Scores of 16 slots at a time: the keys' units
// transposed across slots once per block, so each vdpbf16ps / FMA serves 16 slots and no sum runs across lanes;
// softmax (its denominator by rank: RankSum) and the weighted sum in fp32, rounded to bf16 once in bf16.
template <class E>
void attend(const at::Tensor& qc, const at::Tensor& kc, const at::Tensor& vc, const at::Tensor& mc, double scale,
            at::Tensor& out) {
  using T = typename E::T;
  const int64_t B = qc.size(0), H = qc.size(1), Q = qc.size(2), D = qc.size(3), KVH = kc.size(1), N = kc.size(2);
  const int64_t G = H / KVH, R = G * Q, DB = D / 16, U = D / E::PER;
  // half of a kv head's rows a task (two threads share each head of a decode pass), at most TASK_ROWS
  const int64_t per = std::min<int64_t>((R + 1) / 2, TASK_ROWS), parts = (R + per - 1) / per;
  const auto* qp = reinterpret_cast<const T*>(qc.data_ptr());
  const auto* kp = reinterpret_cast<const T*>(kc.data_ptr());
  const auto* vp = reinterpret_cast<const T*>(vc.data_ptr());
  const float* mp = mc.data_ptr<float>();
  auto* op = reinterpret_cast<T*>(out.data_ptr());
  const int64_t mstride_b = mc.size(0) == 1 ? 0 : mc.stride(0);
  const __m512 vscale = _mm512_set1_ps((float)scale), vseen = _mm512_set1_ps(MASKED);
  const int64_t kstride = kc.stride(2), vstride = vc.stride(2);
  at::parallel_for(0, B * KVH * parts, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / (KVH * parts), kh = (t / parts) % KVH, r0 = (t % parts) * per;
      const int64_t rows = std::min<int64_t>(per, R - r0);
      std::vector<float> scores(rows * N);
      std::vector<float*> srow(rows);
      std::vector<const int32_t*> qrow(rows);
      std::vector<const float*> mrow(rows);
      std::vector<int64_t> head(rows), qi(rows);
      for (int64_t r = 0; r < rows; ++r) {
        head[r] = kh * G + (r0 + r) / Q;
        qi[r] = (r0 + r) % Q;
        qrow[r] = reinterpret_cast<const int32_t*>(qp + b * qc.stride(0) + head[r] * qc.stride(1) +
                                                   qi[r] * qc.stride(2));
        mrow[r] = mp + b * mstride_b + qi[r] * mc.stride(2);
        srow[r] = scores.data() + r * N;
      }
      const T* kb = kp + b * kc.stride(0) + kh * kc.stride(1);
      const T* vb = vp + b * vc.stride(0) + kh * vc.stride(1);
      __m512i kt[MAXD];
      for (int64_t j0 = 0; j0 < N; j0 += 16) {
        const __mmask16 live = first_lanes(N - j0);
        const int64_t slots = std::min<int64_t>(16, N - j0);
        for (int64_t h = 0; h < U / 16; ++h) {     // 16 slots x 16 units, transposed in registers
          __m512i rows16[16];
          for (int64_t sl = 0; sl < 16; ++sl)
            rows16[sl] = sl < slots ? _mm512_loadu_si512(kb + (j0 + sl) * kstride + 16 * E::PER * h)
                                    : _mm512_setzero_si512();
          transpose16(rows16);
          for (int64_t i = 0; i < 16; ++i) kt[16 * h + i] = rows16[i];
        }
        for (int64_t rt = 0; rt < rows; rt += RTILE) {
          const int n = static_cast<int>(std::min<int64_t>(RTILE, rows - rt));
          with_rows(n, [&](auto r) {
            score_tile<E, decltype(r)::value>(kt, U, qrow.data() + rt, mrow.data() + rt, srow.data() + rt, j0, live,
                                              vscale);
          });
        }
      }
      std::vector<float> inv(rows);
      for (int64_t r = 0; r < rows; ++r) {
        float* s = srow[r];
        __m512 mv = _mm512_set1_ps(-INFINITY);
        for (int64_t j = 0; j < N; j += 16) {
          const __mmask16 live = first_lanes(N - j);
          mv = _mm512_mask_max_ps(mv, live, mv, _mm512_maskz_loadu_ps(live, s + j));
        }
        const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mv));
        RankSum sum;
        for (int64_t j = 0; j < N; j += 16) {
          const __mmask16 live = first_lanes(N - j);
          const __m512 score = _mm512_maskz_loadu_ps(live, s + j);
          const __m512 e = _mm512_maskz_mov_ps(live, exp16(_mm512_sub_ps(score, m)));
          _mm512_mask_storeu_ps(s + j, live, e);
          sum.add(e, _mm512_mask_cmp_ps_mask(live, score, vseen, _CMP_GT_OQ));
        }
        inv[r] = 1.0f / sum.total();
      }
      // weighted sum: tiles of 8 rows x 2 blocks of 16 values (16 accumulators)
      std::vector<T*> orow(rows);
      for (int64_t rt = 0; rt < rows; rt += RTILE) {
        const int n = static_cast<int>(std::min<int64_t>(RTILE, rows - rt));
        for (int64_t c = 0; c < DB; c += 2) {
          for (int64_t r = 0; r < n; ++r)
            orow[rt + r] = op + ((b * Q + qi[rt + r]) * H + head[rt + r]) * D + 16 * c;
          with_rows(n, [&](auto r) {
            value_tile<E, decltype(r)::value>(srow.data() + rt, inv.data() + rt, vb + 16 * c, vstride, N,
                                              orow.data() + rt);
          });
        }
      }
    }
  });
}

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                     double scale) {
  const auto dt = q.scalar_type();
  TORCH_CHECK((dt == at::kBFloat16 || dt == at::kFloat) && k.scalar_type() == dt && v.scalar_type() == dt &&
              q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && mask.dim() == 4,
              "assistant_kernels::attention: bf16 or fp32 [B, H, Q, D] query and [B, KVH, N, D] keys/values of "
              "its dtype expected");
  const int64_t H = q.size(1), Q = q.size(2), D = q.size(3), KVH = k.size(1), N = k.size(2);
  TORCH_CHECK(D % 32 == 0 && D <= MAXD && H % KVH == 0 && v.size(2) == N && mask.size(2) == Q && mask.size(3) == N,
              "assistant_kernels::attention: unsupported shapes");
  const at::Tensor qc = q.stride(3) == 1 ? q : q.contiguous();
  const at::Tensor kc = k.stride(3) == 1 ? k : k.contiguous();
  const at::Tensor vc = v.stride(3) == 1 ? v : v.contiguous();
  const at::Tensor mc = mask.scalar_type() == at::kFloat ? mask.contiguous() : mask.to(at::kFloat).contiguous();
  at::Tensor out = at::empty({q.size(0), Q, H, D}, q.options());
  if (dt == at::kFloat) {
    attend<AttnF32>(qc, kc, vc, mc, scale, out);
    return out;
  }
#ifdef ASSISTANT_BF16
  attend<AttnBf16>(qc, kc, vc, mc, scale, out);
#else
  TORCH_CHECK(false, "assistant_kernels::attention: this build (no AVX512-BF16) has no bf16 kernel");
#endif
  return out;
}
#else
// The AVX2 build's fp32 attention: the AVX512 one's arithmetic on 8-lane vectors, so every output equals that
// build's bit for bit: each score its dimensions' FMAs in order, then scale and mask in one FMA; exp16's polynomial
// (2^n built in the exponent bits: n is in [-126, 127] for the x it takes, and the product rounds once, as scalef
// does); the denominator in 16 lanes by rank, reduced in _mm512_reduce_add_ps's order; the weighted sum in slot
// order. Row-invariant for the same reason (see RankSum), and one call a layer where the compiled graph ran two
// aten::bmm and a softmax (K21).
constexpr int64_t VTILE = 6;      // query rows x 16 values a weighted-sum tile keeps (12 accumulators)

inline __m256 exp8(__m256 x) {
  const __m256 live = _mm256_cmp_ps(x, _mm256_set1_ps(EXP_LO), _CMP_GE_OQ);
  x = _mm256_min_ps(x, _mm256_set1_ps(EXP_HI));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(EXP_LOG2E)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_HI), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_LO), r);
  __m256 p = _mm256_set1_ps(EXP_POLY[0]);
  for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_POLY[i]));
  p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256 two_n = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  return _mm256_and_ps(live, _mm256_mul_ps(p, two_n));      // a masked lane's NaN or garbage ANDed to 0
}

inline __m256i first_lanes8(int64_t n) {      // all-ones in the first min(n, 8) of 8 lanes
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::min<int64_t>(n, 8))),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// The AVX512 RankSum with its 16 lanes as two 8-lane halves: the terms of seen slots go to lanes by rank
// (the k-th seen term to lane k % 16) and a full buffer of 16 is added to the sums; a chunk of 8 seen slots
// whose first rank is a multiple of 8 is one vector store.
struct RankSum {
  __m256 sum[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  alignas(32) float buf[16] = {};
  int fill = 0;

  void flush() {
    sum[0] = _mm256_add_ps(sum[0], _mm256_load_ps(buf));
    sum[1] = _mm256_add_ps(sum[1], _mm256_load_ps(buf + 8));
    std::memset(buf, 0, sizeof(buf));
    fill = 0;
  }

  void add(__m256 e, int seen) {               // seen: bit i set where lane i's slot is seen
    if (seen == 0xFF && (fill & 7) == 0) {
      _mm256_store_ps(buf + fill, e);
      if ((fill += 8) == 16) flush();
      return;
    }
    alignas(32) float t[8];
    _mm256_store_ps(t, e);
    for (int i = 0; i < 8; ++i)
      if (seen >> i & 1) {
        buf[fill] = t[i];
        if (++fill == 16) flush();
      }
  }

  float total() const {                        // _mm512_reduce_add_ps(sum + buf), in its order
    const __m256 lo = _mm256_add_ps(sum[0], _mm256_load_ps(buf)), hi = _mm256_add_ps(sum[1], _mm256_load_ps(buf + 8));
    const __m256 t3 = _mm256_add_ps(hi, lo);
    const __m128 t6 = _mm_add_ps(_mm256_extractf128_ps(t3, 1), _mm256_castps256_ps128(t3));
    const __m128 t8 = _mm_add_ps(t6, _mm_shuffle_ps(t6, t6, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm_cvtss_f32(t8) + _mm_cvtss_f32(_mm_shuffle_ps(t8, t8, _MM_SHUFFLE(3, 2, 0, 1)));
  }
};

// r[i] lane j <- r[j] lane i, 8 x 8 floats
inline void transpose8(__m256 r[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

// Scores of R query rows against 8 slots (kt: the slots' keys transposed, D vectors), scaled and masked.
template <int R>
inline void score_tile8(const __m256* kt, int64_t D, const float* const* qrow, const float* const* mrow,
                        float* const* score, int64_t j0, __m256i live, __m256 vscale) {
  __m256 acc[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t u = 0; u < D; ++u) {
    const __m256 kv = kt[u];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(qrow[r] + u), kv, acc[r]);
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
    _mm256_maskstore_ps(score[r] + j0, live,
                        _mm256_fmadd_ps(acc[r], vscale, _mm256_maskload_ps(mrow[r] + j0, live)));
}

// out[r][0:16] = sum_j prob[r][j] * v[j][0:16] * inv[r] for R rows over N slots, in slot order.
template <int R>
inline void value_tile8(const float* const* prob, const float* inv, const float* v, int64_t vstride, int64_t N,
                        float* const* out) {
  __m256 o0[R], o1[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) o0[r] = o1[r] = _mm256_setzero_ps();
  for (int64_t j = 0; j < N; ++j) {
    const __m256 v0 = _mm256_loadu_ps(v + j * vstride), v1 = _mm256_loadu_ps(v + j * vstride + 8);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 p = _mm256_broadcast_ss(prob[r] + j);
      o0[r] = _mm256_fmadd_ps(p, v0, o0[r]);
      o1[r] = _mm256_fmadd_ps(p, v1, o1[r]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const __m256 s = _mm256_set1_ps(inv[r]);
    _mm256_storeu_ps(out[r], _mm256_mul_ps(o0[r], s));
    _mm256_storeu_ps(out[r] + 8, _mm256_mul_ps(o1[r], s));
  }
}

// The AVX512 attend's tasks and steps (see there), fp32.
void attend8(const at::Tensor& qc, const at::Tensor& kc, const at::Tensor& vc, const at::Tensor& mc, double scale,
             at::Tensor& out) {
  const int64_t B = qc.size(0), H = qc.size(1), Q = qc.size(2), D = qc.size(3), KVH = kc.size(1), N = kc.size(2);
  const int64_t G = H / KVH, R = G * Q;
  const int64_t per = std::min<int64_t>((R + 1) / 2, TASK_ROWS), parts = (R + per - 1) / per;
  const float* qp = qc.data_ptr<float>();
  const float* kp = kc.data_ptr<float>();
  const float* vp = vc.data_ptr<float>();
  const float* mp = mc.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t mstride_b = mc.size(0) == 1 ? 0 : mc.stride(0);
  const __m256 vscale = _mm256_set1_ps((float)scale), vseen = _mm256_set1_ps(MASKED);
  const int64_t kstride = kc.stride(2), vstride = vc.stride(2);
  at::parallel_for(0, B * KVH * parts, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / (KVH * parts), kh = (t / parts) % KVH, r0 = (t % parts) * per;
      const int64_t rows = std::min<int64_t>(per, R - r0);
      std::vector<float> scores(rows * N);
      std::vector<float*> srow(rows);
      std::vector<const float*> qrow(rows), mrow(rows);
      std::vector<int64_t> head(rows), qi(rows);
      for (int64_t r = 0; r < rows; ++r) {
        head[r] = kh * G + (r0 + r) / Q;
        qi[r] = (r0 + r) % Q;
        qrow[r] = qp + b * qc.stride(0) + head[r] * qc.stride(1) + qi[r] * qc.stride(2);
        mrow[r] = mp + b * mstride_b + qi[r] * mc.stride(2);
        srow[r] = scores.data() + r * N;
      }
      const float* kb = kp + b * kc.stride(0) + kh * kc.stride(1);
      const float* vb = vp + b * vc.stride(0) + kh * vc.stride(1);
      __m256 kt[MAXD];
      for (int64_t j0 = 0; j0 < N; j0 += 8) {
        const int64_t slots = std::min<int64_t>(8, N - j0);
        for (int64_t h = 0; h < D / 8; ++h) {      // 8 slots x 8 dimensions, transposed in registers
          __m256 rows8[8];
          for (int64_t sl = 0; sl < 8; ++sl)
            rows8[sl] = sl < slots ? _mm256_loadu_ps(kb + (j0 + sl) * kstride + 8 * h) : _mm256_setzero_ps();
          transpose8(rows8);
          for (int64_t i = 0; i < 8; ++i) kt[8 * h + i] = rows8[i];
        }
        const __m256i live = first_lanes8(slots);
        for (int64_t rt = 0; rt < rows; rt += RTILE) {
          const int n = static_cast<int>(std::min<int64_t>(RTILE, rows - rt));
          with_rows(n, [&](auto r) {
            score_tile8<decltype(r)::value>(kt, D, qrow.data() + rt, mrow.data() + rt, srow.data() + rt, j0, live,
                                            vscale);
          });
        }
      }
      std::vector<float> inv(rows);
      for (int64_t r = 0; r < rows; ++r) {
        float* s = srow[r];
        float mx = -INFINITY;
        for (int64_t j = 0; j < N; ++j) mx = std::max(mx, s[j]);
        const __m256 m = _mm256_set1_ps(mx);
        RankSum sum;
        for (int64_t j = 0; j < N; j += 8) {
          const __m256i live = first_lanes8(N - j);
          const __m256 score = _mm256_maskload_ps(s + j, live);
          const __m256 e = _mm256_and_ps(_mm256_castsi256_ps(live), exp8(_mm256_sub_ps(score, m)));
          _mm256_maskstore_ps(s + j, live, e);
          const int seen = _mm256_movemask_ps(_mm256_and_ps(_mm256_castsi256_ps(live),
                                                            _mm256_cmp_ps(score, vseen, _CMP_GT_OQ)));
          sum.add(e, seen);
        }
        inv[r] = 1.0f / sum.total();
      }
      std::vector<float*> orow(rows);
      for (int64_t rt = 0; rt < rows; rt += VTILE) {
        const int n = static_cast<int>(std::min<int64_t>(VTILE, rows - rt));
        for (int64_t c = 0; c < D; c += 16) {
          for (int64_t r = 0; r < n; ++r) orow[rt + r] = op + ((b * Q + qi[rt + r]) * H + head[rt + r]) * D + c;
          with_rows_upto<VTILE>(n, [&](auto r) {
            value_tile8<decltype(r)::value>(srow.data() + rt, inv.data() + rt, vb + c, vstride, N, orow.data() + rt);
          });
        }
      }
    }
  });
}

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                     double scale) {
  TORCH_CHECK(q.scalar_type() != at::kBFloat16, "assistant_kernels::attention: this build (no AVX512-BF16) has no "
              "bf16 kernel");
  TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat &&
              q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && mask.dim() == 4,
              "assistant_kernels::attention: fp32 [B, H, Q, D] query and [B, KVH, N, D] keys/values expected");
  const int64_t H = q.size(1), Q = q.size(2), D = q.size(3), KVH = k.size(1), N = k.size(2);
  TORCH_CHECK(D % 32 == 0 && D <= MAXD && H % KVH == 0 && v.size(2) == N && mask.size(2) == Q && mask.size(3) == N,
              "assistant_kernels::attention: unsupported shapes");
  const at::Tensor qc = q.stride(3) == 1 ? q : q.contiguous();
  const at::Tensor kc = k.stride(3) == 1 ? k : k.contiguous();
  const at::Tensor vc = v.stride(3) == 1 ? v : v.contiguous();
  const at::Tensor mc = mask.scalar_type() == at::kFloat ? mask.contiguous() : mask.to(at::kFloat).contiguous();
  at::Tensor out = at::empty({q.size(0), Q, H, D}, q.options());
  attend8(qc, kc, vc, mc, scale, out);
  return out;
}
#endif

at::Tensor pack(const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 2 && w.size(0) % 16 == 0 &&
              ((w.scalar_type() == at::kBFloat16 && w.size(1) % 2 == 0) || w.scalar_type() == at::kFloat),
              "assistant_kernels::pack: a bf16 [N, K] weight with N % 16 == 0 and K even, or an fp32 one with "
              "N % 16 == 0, expected");
  const int64_t N = w.size(0), K = w.size(1);
  if (w.scalar_type() == at::kFloat) return w.reshape({N / 16, 16, K}).permute({0, 2, 1}).contiguous();
  return w.reshape({N / 16, 16, K / 2, 2}).permute({0, 2, 1, 3}).contiguous();
}

at::Tensor unpack(const at::Tensor& wp) {
  if (wp.dim() == 3) return wp.permute({0, 2, 1}).reshape({wp.size(0) * 16, wp.size(1)}).contiguous();
  return wp.permute({0, 2, 1, 3}).reshape({wp.size(0) * 16, wp.size(1) * 2}).contiguous();
}

void put(int64_t key, const at::Tensor& w) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  registry[key] = w;
}

void drop(int64_t key) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  registry.erase(key);
}

// A verify pass's commit on a static cache, in one call instead of four tensor ops a layer (~0.5 ms a pass whose
// path is not the tree's first nodes, on machine G): the keys/values of slot start + path[i] moved to slot start + i
// in every [B, KVH, S, D] tensor of `kv`, then every layer's length in `lengths` set to start + len(path). A tree
// path is increasing, so start + path[i] >= start + i and moving in order never overwrites a slot still to be read.
void commit_slots(const std::vector<at::Tensor>& kv, const std::vector<at::Tensor>& lengths, int64_t start,
                  const std::vector<int64_t>& path) {
  for (size_t i = 0; i < path.size(); ++i)
    TORCH_CHECK(path[i] >= static_cast<int64_t>(i) && (i == 0 || path[i] > path[i - 1]),
                "assistant_kernels::commit_slots: an increasing path of tree nodes expected");
  for (const auto& t : kv) {
    TORCH_CHECK(t.device().is_cpu() && t.dim() == 4 && t.stride(3) == 1 && t.stride(2) == t.size(3),
                "assistant_kernels::commit_slots: CPU [B, KVH, S, D] cache tensors with rows of D contiguous expected");
    TORCH_CHECK(path.empty() || start + path.back() < t.size(2), "assistant_kernels::commit_slots: a slot past the cache");
    const int64_t row = t.size(3) * t.element_size();
    char* base = static_cast<char*>(t.data_ptr());
    for (size_t i = 0; i < path.size(); ++i) {
      const int64_t from = start + path[i], to = start + static_cast<int64_t>(i);
      if (from == to) continue;
      for (int64_t b = 0; b < t.size(0); ++b)
        for (int64_t h = 0; h < t.size(1); ++h) {
          char* p = base + (b * t.stride(0) + h * t.stride(1)) * t.element_size();
          std::memcpy(p + to * row, p + from * row, row);
        }
    }
  }
  for (const auto& l : lengths) {
    TORCH_CHECK(l.device().is_cpu() && l.scalar_type() == at::kLong && l.numel() == 1,
                "assistant_kernels::commit_slots: one int64 length a layer expected");
    *l.data_ptr<int64_t>() = start + static_cast<int64_t>(path.size());
  }
}

}  // namespace

TORCH_LIBRARY(assistant_kernels, m) {
  m.def("linear(Tensor x, int key, int n) -> Tensor");
  m.def("linear_packed(Tensor x, Tensor w, int n) -> Tensor");
  m.def("attention(Tensor q, Tensor k, Tensor v, Tensor mask, float scale) -> Tensor");
  m.def("pack(Tensor w) -> Tensor", pack);
  m.def("pack_blocks(Tensor w) -> Tensor", pack_blocks);
  m.def("unpack(Tensor w) -> Tensor", unpack);
  m.def("put(int key, Tensor w) -> ()", put);
  m.def("drop(int key) -> ()", drop);
  m.def("commit_slots(Tensor[] kv, Tensor[] lengths, int start, int[] path) -> ()", commit_slots);
}

TORCH_LIBRARY_IMPL(assistant_kernels, CPU, m) {
  m.impl("linear", linear);
  m.impl("linear_packed", linear_packed);
  m.impl("attention", attention);
}
