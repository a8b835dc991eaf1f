// 1-bit sign packing in np.packbits(x >= 0) order (element 8j+k is bit 7-k of byte j) and
// unpacking to +scale/-scale, equal to dlcomm/compression/sign.py.
#include <immintrin.h>

#include "dlcomm_native.h"

namespace {

// Bit k of a movemask is element k; packbits wants element k at bit 7-k.
struct BitReverse {
  uint8_t table[256];
  BitReverse() {
    for (int v = 0; v < 256; ++v) {
      int r = 0;
      for (int k = 0; k < 8; ++k) r |= ((v >> k) & 1) << (7 - k);
      table[v] = uint8_t(r);
    }
  }
};
const BitReverse kReverse;

inline bool f16_nonnegative(uint16_t h) {  // h >= 0 in float16: not NaN, sign clear or -0
  return (h & 0x8000u) ? h == 0x8000u : (h & 0x7fffu) <= 0x7c00u;
}

template <class T>
inline bool nonnegative(T x) { return x >= T(0); }  // false for NaN

// Packs elements [8 * jlo, 8 * jhi) into bytes [jlo, jhi); a final partial byte pads with 0.
template <class T>
void pack_scalar(const T* in, uint8_t* out, int64_t n, int64_t jlo, int64_t jhi) {
  for (int64_t j = jlo; j < jhi; ++j) {
    uint8_t byte = 0;
    for (int k = 0; k < 8; ++k) {
      const int64_t i = 8 * j + k;
      if (i < n && nonnegative(in[i])) byte |= uint8_t(0x80u >> k);
    }
    out[j] = byte;
  }
}

void pack_f16_scalar(const uint16_t* in, uint8_t* out, int64_t n, int64_t jlo, int64_t jhi) {
  for (int64_t j = jlo; j < jhi; ++j) {
    uint8_t byte = 0;
    for (int k = 0; k < 8; ++k) {
      const int64_t i = 8 * j + k;
      if (i < n && f16_nonnegative(in[i])) byte |= uint8_t(0x80u >> k);
    }
    out[j] = byte;
  }
}

#if defined(__x86_64__)
// Full bytes only (8 elements each); the caller packs a partial last byte with the scalar path.
__attribute__((target("avx2,f16c")))
void pack_f32_simd(const float* in, uint8_t* out, int64_t jlo, int64_t jhi) {
  const __m256 zero = _mm256_setzero_ps();
  for (int64_t j = jlo; j < jhi; ++j) {
    const __m256 x = _mm256_loadu_ps(in + 8 * j);
    out[j] = kReverse.table[_mm256_movemask_ps(_mm256_cmp_ps(x, zero, _CMP_GE_OQ))];
  }
}

__attribute__((target("avx2,f16c")))
void pack_f16_simd(const uint16_t* in, uint8_t* out, int64_t jlo, int64_t jhi) {
  const __m256 zero = _mm256_setzero_ps();
  for (int64_t j = jlo; j < jhi; ++j) {  // float16 -> float32 keeps NaN NaN and -0 as -0
    const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 8 * j)));
    out[j] = kReverse.table[_mm256_movemask_ps(_mm256_cmp_ps(x, zero, _CMP_GE_OQ))];
  }
}

__attribute__((target("avx2,f16c")))
void pack_f64_simd(const double* in, uint8_t* out, int64_t jlo, int64_t jhi) {
  const __m256d zero = _mm256_setzero_pd();
  for (int64_t j = jlo; j < jhi; ++j) {
    const int lo = _mm256_movemask_pd(_mm256_cmp_pd(_mm256_loadu_pd(in + 8 * j), zero, _CMP_GE_OQ));
    const int hi = _mm256_movemask_pd(_mm256_cmp_pd(_mm256_loadu_pd(in + 8 * j + 4), zero, _CMP_GE_OQ));
    out[j] = kReverse.table[lo | (hi << 4)];
  }
}
#endif

template <class T>
void unpack(const uint8_t* packed, int64_t n, T pos, T neg, T* out) {
  T table[256][8];  // every byte value spelled out as 8 elements
  for (int v = 0; v < 256; ++v)
    for (int k = 0; k < 8; ++k) table[v][k] = ((v >> (7 - k)) & 1) ? pos : neg;
  const int64_t full = n / 8;
  dlc::chunked(full, [&](int64_t lo, int64_t hi) {
    for (int64_t j = lo; j < hi; ++j) memcpy(out + 8 * j, table[packed[j]], sizeof(T) * 8);
  });
  for (int64_t i = 8 * full; i < n; ++i) out[i] = ((packed[i / 8] >> (7 - i % 8)) & 1) ? pos : neg;
}

}  // namespace

extern "C" {

void dlc_sign_pack(const void* in, int dtype_code, uint8_t* out, int64_t n) {
  const int64_t full = n / 8, bytes = (n + 7) / 8;
  const bool simd = dlc::simd_enabled();
  dlc::chunked(full, [&](int64_t lo, int64_t hi) {
    switch (dtype_code) {
      case 0:
#if defined(__x86_64__)
        if (simd) return pack_f16_simd(static_cast<const uint16_t*>(in), out, lo, hi);
#endif
        return pack_f16_scalar(static_cast<const uint16_t*>(in), out, n, lo, hi);
      case 1:
#if defined(__x86_64__)
        if (simd) return pack_f32_simd(static_cast<const float*>(in), out, lo, hi);
#endif
        return pack_scalar(static_cast<const float*>(in), out, n, lo, hi);
      default:
#if defined(__x86_64__)
        if (simd) return pack_f64_simd(static_cast<const double*>(in), out, lo, hi);
#endif
        return pack_scalar(static_cast<const double*>(in), out, n, lo, hi);
    }
  });
  if (full == bytes) return;
  if (dtype_code == 0) pack_f16_scalar(static_cast<const uint16_t*>(in), out, n, full, bytes);
  else if (dtype_code == 1) pack_scalar(static_cast<const float*>(in), out, n, full, bytes);
  else pack_scalar(static_cast<const double*>(in), out, n, full, bytes);
}

void dlc_sign_unpack(const uint8_t* packed, int64_t n, int elem_size, const void* pos,
                     const void* neg, void* out) {
  if (elem_size == 2) {
    uint16_t p, q;
    memcpy(&p, pos, 2); memcpy(&q, neg, 2);
    unpack(packed, n, p, q, static_cast<uint16_t*>(out));
  } else if (elem_size == 4) {
    uint32_t p, q;
    memcpy(&p, pos, 4); memcpy(&q, neg, 4);
    unpack(packed, n, p, q, static_cast<uint32_t*>(out));
  } else {
    uint64_t p, q;
    memcpy(&p, pos, 8); memcpy(&q, neg, 8);
    unpack(packed, n, p, q, static_cast<uint64_t*>(out));
  }
}

}  // extern "C"
