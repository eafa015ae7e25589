// bf16 linear for few rows (decode passes: 1-16 tree nodes) on CPUs with AVX512-BF16.
//
// y[M, N] = x[M, K] @ W[N, K]^T, fp32 accumulation, rounded to bf16 once (as oneDNN does). W is packed once
// as [N/16, K/2, 16, 2]: one 64-byte load gives 16 output columns x 2 inputs, the operand of one
// vdpbf16ps; every load of W serves all rows of the tile, so W streams through the cache once a call.
// Weights live in a registry under an integer key (the key a compiled graph bakes in), so the op takes
// no Python on its way: assistant_kernels::linear(x, key, n).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <unordered_map>

namespace {

std::mutex registry_mutex;
std::unordered_map<int64_t, at::Tensor> registry;

// MT rows x NB blocks of 16 columns; w points at the first block, blocks are K2 * 32 elements apart.
template <int MT, int NB>
inline void tile(const uint16_t* __restrict x, int64_t K, const uint16_t* __restrict w, int64_t K2,
                 uint16_t* __restrict y, int64_t N) {
  __m512 acc[MT][NB];
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_setzero_ps();
  const int64_t block = K2 * 32;
  for (int64_t kp = 0; kp < K2; ++kp) {
    __m512bh wv[NB];
    for (int j = 0; j < NB; ++j) wv[j] = (__m512bh)_mm512_loadu_si512(w + j * block + kp * 32);
    for (int i = 0; i < MT; ++i) {
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(reinterpret_cast<const int32_t*>(x + i * K)[kp]);
      for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv, wv[j]);
    }
  }
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < NB; ++j)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i * N + j * 16), (__m256i)_mm512_cvtneps_pbh(acc[i][j]));
}

template <int NB>
void rows(int m, const uint16_t* x, int64_t K, const uint16_t* w, int64_t K2, uint16_t* y, int64_t N) {
  switch (m) {
#define ROWS(r) \
  case r:       \
    tile<r, NB>(x, K, w, K2, y, N); \
    break;
    ROWS(1) ROWS(2) ROWS(3) ROWS(4) ROWS(5) ROWS(6) ROWS(7) ROWS(8)
#undef ROWS
  }
}

constexpr int64_t GROUP = 4;   // blocks of 16 columns a task takes: 64 columns, <= 196 KB of W at K = 1536
constexpr int64_t MTILE = 8;

at::Tensor linear_packed(const at::Tensor& x, const at::Tensor& wp, int64_t n) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && wp.scalar_type() == at::kBFloat16 && wp.dim() == 4,
              "assistant_kernels::linear: bf16 input and a packed bf16 weight expected");
  const at::Tensor xc = x.contiguous();
  const int64_t K = xc.size(-1), K2 = wp.size(1), blocks = wp.size(0);
  TORCH_CHECK(K == 2 * K2 && n == blocks * 16, "assistant_kernels::linear: shapes do not match the packed weight");
  const int64_t M = K ? xc.numel() / K : 0;
  std::vector<int64_t> sizes = xc.sizes().vec();
  sizes.back() = n;
  at::Tensor y = at::empty(sizes, xc.options());
  const auto* xp = reinterpret_cast<const uint16_t*>(xc.data_ptr());
  const auto* w = reinterpret_cast<const uint16_t*>(wp.data_ptr());
  auto* yp = reinterpret_cast<uint16_t*>(y.data_ptr());
  const int64_t groups = (blocks + GROUP - 1) / GROUP;
  at::parallel_for(0, groups, 1, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t b0 = g * GROUP, nb = std::min<int64_t>(GROUP, blocks - b0);
      for (int64_t m0 = 0; m0 < M; m0 += MTILE) {
        const int m = static_cast<int>(std::min<int64_t>(MTILE, M - m0));
        const uint16_t* xm = xp + m0 * K;
        uint16_t* ym = yp + m0 * n + b0 * 16;
        const uint16_t* wb = w + b0 * K2 * 32;
        if (nb == 4 && m <= 4) {
          rows<4>(m, xm, K, wb, K2, ym, n);
          continue;
        }
        int64_t b = 0;
        for (; b + 2 <= nb; b += 2) rows<2>(m, xm, K, wb + b * K2 * 32, K2, ym + b * 16, n);
        if (b < nb) rows<1>(m, xm, K, wb + b * K2 * 32, K2, ym + b * 16, n);
      }
    }
  });
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

at::Tensor pack(const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 2 && w.size(0) % 16 == 0 && w.size(1) % 2 == 0 && w.scalar_type() == at::kBFloat16,
              "assistant_kernels::pack: a bf16 [N, K] weight with N % 16 == 0 and K even expected");
  const int64_t N = w.size(0), K = w.size(1);
  return w.reshape({N / 16, 16, K / 2, 2}).permute({0, 2, 1, 3}).contiguous();
}

at::Tensor unpack(const at::Tensor& wp) {
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

}  // namespace

TORCH_LIBRARY(assistant_kernels, m) {
  m.def("linear(Tensor x, int key, int n) -> Tensor");
  m.def("linear_packed(Tensor x, Tensor w, int n) -> Tensor");
  m.def("pack(Tensor w) -> Tensor", pack);
  m.def("unpack(Tensor w) -> Tensor", unpack);
  m.def("put(int key, Tensor w) -> ()", put);
  m.def("drop(int key) -> ()", drop);
}

TORCH_LIBRARY_IMPL(assistant_kernels, CPU, m) {
  m.impl("linear", linear);
  m.impl("linear_packed", linear_packed);
}
