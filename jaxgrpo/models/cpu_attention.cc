// Decode attention over a KV cache's live slots, for XLA:CPU (an XLA FFI custom call).
//
// One call per layer and decode step: for every (row, kv head), the online-softmax state (max,
// normalizer, unnormalized output) of its G queries over the cache slots below `live` that `mask`
// keeps. The cache is read in place: XLA:CPU copies every dynamic slice that a product reads, and its
// batched [G, D] x [D, S] products per (row, kv head) are small, so the chunked XLA form spent most of
// a step there (docs/sampler.md). Built at first use by jaxgrpo/models/cpu_kernels.py.
//
// Inputs: q f32 [B, KV, G, D]; k, v [L, B / share, KV, C, D] (bfloat16 bits as u16, or f32), row b
// reading cache row b / share (a prompt cache shared by its samples has share = G samples); mask pred
// [B / share, C]; layer, live s32 scalars; attributes scale, share. Outputs: max, normalizer f32
// [B, KV, G]; output f32 [B, KV, G, D]. A (row, kv head) with no slot kept gets max -1e30, normalizer 0
// and output 0.

#include <cstdint>
#include <cstring>
#include <cmath>
#include <vector>

#include "cpu_parallel.h"
#include "xla/ffi/api/ffi.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace ffi = xla::ffi;

namespace {

constexpr float kMaskedScore = -1e30f;

struct Problem {
  const float* q;
  const void* k;
  const void* v;
  const bool* mask;
  float* top;
  float* total;
  float* out;
  int64_t batch, cache_rows, share, kv_heads, capacity, head_dim, groups, layer, live;
  float scale;
};

#if defined(__AVX512F__)

// Sixteen cache elements as float32.
template <typename E>
inline __m512 Load16(const E* p);
template <>
inline __m512 Load16<uint16_t>(const uint16_t* p) {  // bfloat16 bits: the float32 with the low half zero
  const __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}
template <>
inline __m512 Load16<float>(const float* p) {
  return _mm512_loadu_ps(p);
}

// Rows [row_begin, row_end) of the batch; kD = head_dim (a multiple of 16).
template <typename E, int kD>
void Rows(const Problem& p, int64_t row_begin, int64_t row_end) {
  constexpr int kVectors = kD / 16;
  constexpr int kGroupBlock = 256 / kD;  // queries whose outputs stay in registers together (16 zmm)
  const E* keys = static_cast<const E*>(p.k);
  const E* values = static_cast<const E*>(p.v);
  const int64_t groups = p.groups, capacity = p.capacity;
  std::vector<int32_t> slots(p.live > 0 ? p.live : 1);
  std::vector<float> weights(groups * (p.live > 0 ? p.live : 1));
  for (int64_t b = row_begin; b < row_end; ++b) {
    const int64_t r = b / p.share;  // the cache row this row reads
    int64_t n = 0;                  // its kept slots
    for (int64_t s = 0; s < p.live; ++s) {
      if (p.mask[r * capacity + s]) slots[n++] = static_cast<int32_t>(s);
    }
    for (int64_t h = 0; h < p.kv_heads; ++h) {
      const int64_t head = b * p.kv_heads + h;
      const int64_t base = ((p.layer * p.cache_rows + r) * p.kv_heads + h) * capacity * kD;
      const float* q = p.q + head * groups * kD;
      float* top = p.top + head * groups;
      float* total = p.total + head * groups;
      float* out = p.out + head * groups * kD;
      if (n == 0) {
        for (int64_t g = 0; g < groups; ++g) top[g] = kMaskedScore, total[g] = 0.f;
        std::memset(out, 0, sizeof(float) * groups * kD);
        continue;
      }
      // Scores: weights[g * n + j] = scale * q[g] . k[slot j].
      for (int64_t j = 0; j < n; ++j) {
        const E* k = keys + base + static_cast<int64_t>(slots[j]) * kD;
        __m512 kv[kVectors];
        for (int c = 0; c < kVectors; ++c) kv[c] = Load16<E>(k + 16 * c);
        for (int64_t g = 0; g < groups; ++g) {
          const float* qg = q + g * kD;
          __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(qg), kv[0]);
          for (int c = 1; c < kVectors; ++c) acc = _mm512_fmadd_ps(_mm512_loadu_ps(qg + 16 * c), kv[c], acc);
          weights[g * n + j] = _mm512_reduce_add_ps(acc) * p.scale;
        }
      }
      // Softmax numerators against each query's max.
      for (int64_t g = 0; g < groups; ++g) {
        float* w = weights.data() + g * n;
        float best = kMaskedScore;
        for (int64_t j = 0; j < n; ++j) best = w[j] > best ? w[j] : best;
        float sum = 0.f;
        for (int64_t j = 0; j < n; ++j) {
          w[j] = std::exp(w[j] - best);
          sum += w[j];
        }
        top[g] = best;
        total[g] = sum;
      }
      // Outputs: out[g] = sum_j weights[g, j] * v[slot j], kGroupBlock queries at a time.
      for (int64_t g0 = 0; g0 < groups; g0 += kGroupBlock) {
        const int64_t block = groups - g0 < kGroupBlock ? groups - g0 : kGroupBlock;
        __m512 acc[kGroupBlock][kVectors];
        for (int i = 0; i < kGroupBlock; ++i)
          for (int c = 0; c < kVectors; ++c) acc[i][c] = _mm512_setzero_ps();
        for (int64_t j = 0; j < n; ++j) {
          const E* v = values + base + static_cast<int64_t>(slots[j]) * kD;
          __m512 vv[kVectors];
          for (int c = 0; c < kVectors; ++c) vv[c] = Load16<E>(v + 16 * c);
          for (int64_t i = 0; i < block; ++i) {
            const __m512 w = _mm512_set1_ps(weights[(g0 + i) * n + j]);
            for (int c = 0; c < kVectors; ++c) acc[i][c] = _mm512_fmadd_ps(w, vv[c], acc[i][c]);
          }
        }
        for (int64_t i = 0; i < block; ++i)
          for (int c = 0; c < kVectors; ++c) _mm512_storeu_ps(out + (g0 + i) * kD + 16 * c, acc[i][c]);
      }
    }
  }
}

using RowsFn = void (*)(const Problem&, int64_t, int64_t);

RowsFn Select(bool bfloat16, int64_t head_dim) {
  if (head_dim == 64) return bfloat16 ? Rows<uint16_t, 64> : Rows<float, 64>;
  if (head_dim == 128) return bfloat16 ? Rows<uint16_t, 128> : Rows<float, 128>;
  return nullptr;
}

#else

using RowsFn = void (*)(const void*, int64_t, int64_t);
RowsFn Select(bool, int64_t) { return nullptr; }

#endif

ffi::Error Attend(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                  ffi::Buffer<ffi::PRED> mask, ffi::Buffer<ffi::S32> layer, ffi::Buffer<ffi::S32> live, float scale,
                  int64_t share,
                  ffi::ResultBuffer<ffi::F32> top, ffi::ResultBuffer<ffi::F32> total,
                  ffi::ResultBuffer<ffi::F32> out) {
  const auto dims = k.dimensions();
  const auto q_dims = q.dimensions();
  if (dims.size() != 5 || q_dims.size() != 4) {
    return ffi::Error::InvalidArgument("cpu_attention: k must be [L, B, KV, C, D] and q [B, KV, G, D]");
  }
  const bool bfloat16 = k.element_type() == ffi::DataType::U16;
  if (!bfloat16 && k.element_type() != ffi::DataType::F32) {
    return ffi::Error::InvalidArgument("cpu_attention: the cache must hold bfloat16 bits (u16) or float32");
  }
  if (v.element_type() != k.element_type()) {
    return ffi::Error::InvalidArgument("cpu_attention: k and v must have the same element type");
  }
  Problem p;
  p.batch = q_dims[0], p.cache_rows = dims[1], p.share = share;
  p.kv_heads = dims[2], p.capacity = dims[3], p.head_dim = dims[4], p.groups = q_dims[2];
  if (share < 1 || p.batch != p.cache_rows * share || q_dims[1] != p.kv_heads || q_dims[3] != p.head_dim) {
    return ffi::Error::InvalidArgument("cpu_attention: q must be [B, KV, G, D] with B = share * the cache's rows");
  }
  p.layer = layer.typed_data()[0];
  p.live = live.typed_data()[0];
  p.live = p.live < 0 ? 0 : (p.live > p.capacity ? p.capacity : p.live);
  if (p.layer < 0 || p.layer >= dims[0]) return ffi::Error::InvalidArgument("cpu_attention: layer out of range");
  auto rows = Select(bfloat16, p.head_dim);
  if (rows == nullptr) return ffi::Error::InvalidArgument("cpu_attention: unsupported head_dim or CPU");
  p.q = q.typed_data(), p.k = k.untyped_data(), p.v = v.untyped_data(), p.mask = mask.typed_data();
  p.top = top->typed_data(), p.total = total->typed_data(), p.out = out->typed_data(), p.scale = scale;

#if defined(__AVX512F__)
  // Rows split over the intra-op pool's threads.
  jaxgrpo::ParallelFor(pool, p.batch, [&p, rows](int64_t begin, int64_t end) { rows(p, begin, end); });
#endif
  return ffi::Error::Success();
}

}  // namespace

// 1 when this build has the vectorized kernel (x86 with AVX-512), else 0: the decoder then uses XLA.
extern "C" int jaxgrpo_cpu_attention_available() {
#if defined(__AVX512F__)
  return 1;
#else
  return 0;
#endif
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxgrpo_cpu_attention, Attend,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()   // q
                                  .Arg<ffi::AnyBuffer>()          // k
                                  .Arg<ffi::AnyBuffer>()          // v
                                  .Arg<ffi::Buffer<ffi::PRED>>()  // mask
                                  .Arg<ffi::Buffer<ffi::S32>>()   // layer
                                  .Arg<ffi::Buffer<ffi::S32>>()   // live
                                  .Attr<float>("scale")
                                  .Attr<int64_t>("share")
                                  .Ret<ffi::Buffer<ffi::F32>>()   // max
                                  .Ret<ffi::Buffer<ffi::F32>>()   // normalizer
                                  .Ret<ffi::Buffer<ffi::F32>>()); // output
