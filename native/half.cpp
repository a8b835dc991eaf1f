// float16 <-> float32 casts and the float16 in-place sum, equal bit for bit to numpy.
// Fast path: AVX2 + F16C, 8 lanes at a time; the hardware quiets signalling NaNs where numpy
// does not, so any block holding a NaN is redone with the scalar numpy-equivalent helpers.
#include <immintrin.h>

#include "dlcomm_native.h"

namespace {

void f32_to_f16_scalar(const float* in, uint16_t* out, int64_t lo, int64_t hi) {
  for (int64_t i = lo; i < hi; ++i) out[i] = dlc::f32_bits_to_f16(dlc::float_bits(in[i]));
}
void f16_to_f32_scalar(const uint16_t* in, float* out, int64_t lo, int64_t hi) {
  for (int64_t i = lo; i < hi; ++i) out[i] = dlc::bits_float(dlc::f16_to_f32_bits(in[i]));
}
void f16_add_scalar(const uint16_t* a, uint16_t* b, int64_t lo, int64_t hi) {
  for (int64_t i = lo; i < hi; ++i) b[i] = dlc::f16_add(a[i], b[i]);
}

#if defined(__x86_64__)
__attribute__((target("avx2,f16c"))) inline __m256 load_f16x8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
__attribute__((target("avx2,f16c"))) inline bool any_nan_f16x8(__m128i h) {
  const __m128i mag = _mm_and_si128(h, _mm_set1_epi16(0x7fff));
  // Signed compare is fine: magnitudes are below 0x8000.
  return _mm_movemask_epi8(_mm_cmpgt_epi16(mag, _mm_set1_epi16(0x7c00))) != 0;
}

__attribute__((target("avx2,f16c")))
void f32_to_f16_simd(const float* in, uint16_t* out, int64_t lo, int64_t hi) {
  int64_t i = lo;
  for (; i + 8 <= hi; i += 8) {
    const __m256 x = _mm256_loadu_ps(in + i);
    if (_mm256_movemask_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q))) {
      f32_to_f16_scalar(in, out, i, i + 8);
      continue;
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  f32_to_f16_scalar(in, out, i, hi);
}

__attribute__((target("avx2,f16c")))
void f16_to_f32_simd(const uint16_t* in, float* out, int64_t lo, int64_t hi) {
  int64_t i = lo;
  for (; i + 8 <= hi; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    if (any_nan_f16x8(h)) {
      f16_to_f32_scalar(in, out, i, i + 8);
      continue;
    }
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  f16_to_f32_scalar(in, out, i, hi);
}

__attribute__((target("avx2,f16c")))
void f16_add_simd(const uint16_t* a, uint16_t* b, int64_t lo, int64_t hi) {
  int64_t i = lo;
  for (; i + 8 <= hi; i += 8) {
    const __m128i ha = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i));
    const __m128i hb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i));
    const __m256 s = _mm256_add_ps(_mm256_cvtph_ps(ha), _mm256_cvtph_ps(hb));
    // NaN inputs or inf + -inf: numpy's NaN choice is made by the scalar helper.
    if (_mm256_movemask_ps(_mm256_cmp_ps(s, s, _CMP_UNORD_Q))) {
      f16_add_scalar(a, b, i, i + 8);
      continue;
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(b + i),
                     _mm256_cvtps_ph(s, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  f16_add_scalar(a, b, i, hi);
}
#endif

}  // namespace

extern "C" {

void dlc_f32_to_f16(const float* in, uint16_t* out, int64_t n) {
  const bool simd = dlc::simd_enabled();
  dlc::chunked(n, [&](int64_t lo, int64_t hi) {
#if defined(__x86_64__)
    if (simd) return f32_to_f16_simd(in, out, lo, hi);
#endif
    f32_to_f16_scalar(in, out, lo, hi);
  });
}

void dlc_f16_to_f32(const uint16_t* in, float* out, int64_t n) {
  const bool simd = dlc::simd_enabled();
  dlc::chunked(n, [&](int64_t lo, int64_t hi) {
#if defined(__x86_64__)
    if (simd) return f16_to_f32_simd(in, out, lo, hi);
#endif
    f16_to_f32_scalar(in, out, lo, hi);
  });
}

void dlc_f16_add_inplace(const uint16_t* a, uint16_t* b, int64_t n) {
  const bool simd = dlc::simd_enabled();
  dlc::chunked(n, [&](int64_t lo, int64_t hi) {
#if defined(__x86_64__)
    if (simd) return f16_add_simd(a, b, lo, hi);
#endif
    f16_add_scalar(a, b, lo, hi);
  });
}

}  // extern "C"
