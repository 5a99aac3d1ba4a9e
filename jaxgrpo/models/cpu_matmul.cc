// A decode step's weight products, x [M, K] x W [K, N] with bfloat16 operands and float32 results,
// for XLA:CPU (an XLA FFI custom call) on CPUs with AVX512-BF16.
//
// At decode batch sizes (M = 32 rows) the weights are read once per step from memory and each element
// serves M rows, so what limits a product is how the weight is laid out: read in the order the
// multiply consumes it, with no shuffles, the products here run at about twice the speed XLA:CPU's
// kernels reach on a [K, N] matrix (docs/sampler.md). The weights are therefore packed once per
// sampler call (jaxgrpo/models/cpu_matmul.py): W [K, N] becomes P [N / 32, K / 2, 32, 2], i.e. for
// each block of 32 columns, the K / 2 pairs of consecutive rows interleaved column by column, which is
// the operand layout of VDPBF16PS (a float32 lane += a0 * b0 + a1 * b1).
//
// Inputs: x u16 [M, K] (bfloat16 bits); w u16 [L, N / 32, K / 2, 64] (L packed matrices, a layer
// stack); layer s32 scalar (which of the L). Output: f32 [M, N]. The stack is read in place.

#include <cstdint>

#include "cpu_parallel.h"
#include "xla/ffi/api/ffi.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace ffi = xla::ffi;

namespace {

struct Product {
  const uint16_t* x;
  const uint16_t* w;  // this layer's packed matrix
  float* out;
  int64_t rows, depth, columns;  // M, K, N
};

#if defined(__AVX512BF16__)

constexpr int kRowTile = 8;  // 8 rows x 32 columns of float32 accumulators: 16 of the 32 zmm registers

// Rows [row, row + kRows) by the 32 columns of block `block`.
template <int kRows>
void Tile(const Product& p, int64_t block, int64_t row) {
  __m512 lo[kRows], hi[kRows];  // columns 0-15 and 16-31
  for (int i = 0; i < kRows; ++i) lo[i] = hi[i] = _mm512_setzero_ps();
  // Row row + i's k-th pair of bfloat16 values is the 32-bit word x[i * pairs + k].
  const uint32_t* x = reinterpret_cast<const uint32_t*>(p.x + row * p.depth);
  const int64_t pairs = p.depth / 2;
  const uint16_t* w = p.w + block * pairs * 64;
  for (int64_t k = 0; k < pairs; ++k, w += 64) {
    const __m512bh w_lo = (__m512bh)_mm512_loadu_si512(w);
    const __m512bh w_hi = (__m512bh)_mm512_loadu_si512(w + 32);
    for (int i = 0; i < kRows; ++i) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(x[i * pairs + k]));
      lo[i] = _mm512_dpbf16_ps(lo[i], w_lo, a);
      hi[i] = _mm512_dpbf16_ps(hi[i], w_hi, a);
    }
  }
  for (int i = 0; i < kRows; ++i) {
    float* out = p.out + (row + i) * p.columns + block * 32;
    _mm512_storeu_ps(out, lo[i]);
    _mm512_storeu_ps(out + 16, hi[i]);
  }
}

// Column blocks [begin, end), every row: each block's weights are read from memory once and then
// from the CPU's caches for the other row tiles.
void Blocks(const Product& p, int64_t begin, int64_t end) {
  const int64_t tail = p.rows % kRowTile, whole = p.rows - tail;
  for (int64_t block = begin; block < end; ++block) {
    for (int64_t row = 0; row < whole; row += kRowTile) Tile<kRowTile>(p, block, row);
    switch (tail) {
      case 1: Tile<1>(p, block, whole); break;
      case 2: Tile<2>(p, block, whole); break;
      case 3: Tile<3>(p, block, whole); break;
      case 4: Tile<4>(p, block, whole); break;
      case 5: Tile<5>(p, block, whole); break;
      case 6: Tile<6>(p, block, whole); break;
      case 7: Tile<7>(p, block, whole); break;
      default: break;
    }
  }
}

#endif

ffi::Error Multiply(ffi::ThreadPool pool, ffi::Buffer<ffi::U16> x, ffi::Buffer<ffi::U16> w,
                    ffi::Buffer<ffi::S32> layer, ffi::ResultBuffer<ffi::F32> out) {
  const auto x_dims = x.dimensions();
  const auto w_dims = w.dimensions();
  if (x_dims.size() != 2 || w_dims.size() != 4 || w_dims[3] != 64) {
    return ffi::Error::InvalidArgument("cpu_matmul: x must be [M, K] and w packed as [L, N / 32, K / 2, 64]");
  }
  if (x_dims[1] != 2 * w_dims[2]) {
    return ffi::Error::InvalidArgument("cpu_matmul: x's K must be twice the packed weight's third dimension");
  }
  const int64_t index = layer.typed_data()[0];
  if (index < 0 || index >= w_dims[0]) return ffi::Error::InvalidArgument("cpu_matmul: layer out of range");
#if defined(__AVX512BF16__)
  const int64_t blocks = w_dims[1];
  Product p{x.typed_data(), w.typed_data() + index * blocks * w_dims[2] * 64, out->typed_data(), x_dims[0],
            x_dims[1], blocks * 32};
  // Column blocks split over the intra-op pool's threads.
  jaxgrpo::ParallelFor(pool, blocks, [&p](int64_t begin, int64_t end) { Blocks(p, begin, end); });
  return ffi::Error::Success();
#else
  return ffi::Error::InvalidArgument("cpu_matmul: built for a CPU without AVX512-BF16");
#endif
}

}  // namespace

// 1 when this build has the kernel (x86 with AVX512-BF16), else 0: the decoder then uses XLA's products.
extern "C" int jaxgrpo_cpu_matmul_available() {
#if defined(__AVX512BF16__)
  return 1;
#else
  return 0;
#endif
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxgrpo_cpu_matmul, Multiply,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::U16>>()   // x
                                  .Arg<ffi::Buffer<ffi::U16>>()   // w, packed
                                  .Arg<ffi::Buffer<ffi::S32>>()   // layer
                                  .Ret<ffi::Buffer<ffi::F32>>()); // out
