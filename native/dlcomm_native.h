// dlcomm native kernels: C ABI shared by native/*.cpp and loaded from Python with ctypes
// (dlcomm/native.py). Every kernel is a speed-up of a numpy reference and returns bit for
// bit what that reference returns; the semantics are spelled out next to each declaration.
#ifndef DLCOMM_NATIVE_H
#define DLCOMM_NATIVE_H

#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DLC_API __attribute__((visibility("default")))

// ---- library controls (native/runtime.cpp) --------------------------------------------
// ABI version: dlcomm/native.py refuses a library whose version differs from its own.
DLC_API int dlc_abi_version(void);
// OpenMP threads used by kernels on arrays of at least dlc_parallel_min() elements.
DLC_API void dlc_set_num_threads(int n);
DLC_API int dlc_get_num_threads(void);
DLC_API int64_t dlc_parallel_min(void);
// 1 when the AVX2+F16C paths are compiled in and the CPU has them; dlc_set_simd(0) forces the
// portable scalar paths (tests check both against numpy).
DLC_API int dlc_simd_available(void);
DLC_API void dlc_set_simd(int enable);

// ---- float16 (native/half.cpp), numpy's float16 semantics ------------------------------
// out[i] = float16(in[i]): round to nearest even, overflow to inf, NaN payload truncated to
// its top 10 bits and kept NaN (not quieted), exactly numpy's astype(float16).
DLC_API void dlc_f32_to_f16(const float* in, uint16_t* out, int64_t n);
// out[i] = float32(in[i]): exact; NaN payloads kept (not quieted), like numpy's astype.
DLC_API void dlc_f16_to_f32(const uint16_t* in, float* out, int64_t n);
// b[i] = np.add(a[i], b[i]) on float16: widen, add in float32, round to nearest even. When
// both are NaN numpy returns b's NaN (quieted); inf + -inf gives 0xFE00.
DLC_API void dlc_f16_add_inplace(const uint16_t* a, uint16_t* b, int64_t n);

// ---- bfloat16 as uint16 bits (native/bfloat16.cpp) -------------------------------------
// Same as dlcomm.bfloat16: round to nearest even, every NaN becomes 0x7FC0.
DLC_API void dlc_f32_to_bf16(const float* in, uint16_t* out, int64_t n);
DLC_API void dlc_bf16_to_f32(const uint16_t* in, float* out, int64_t n);
// b[i] = bf16(float(a[i]) + float(b[i])).
DLC_API void dlc_bf16_add_inplace(const uint16_t* a, uint16_t* b, int64_t n);

// ---- 1-bit signs (native/sign.cpp), np.packbits(x >= 0) order: element 8j+0 is bit 7 ----
// dtype_code: 0 float16 (uint16 bits), 1 float32, 2 float64. out has (n + 7) / 8 bytes; the
// padding bits of the last byte are 0. NaN packs as 0, -0.0 as 1.
DLC_API void dlc_sign_pack(const void* in, int dtype_code, uint8_t* out, int64_t n);
// out[i] = bit i ? pos : neg, for elements of elem_size bytes (2, 4 or 8); pos/neg point at
// one element each (the caller computes +1*scale and -1*scale in the target dtype).
DLC_API void dlc_sign_unpack(const uint8_t* packed, int64_t n, int elem_size, const void* pos,
                             const void* neg, void* out);

// ---- threshold selection with error feedback (native/select.cpp) -----------------------
// Over acc = grad + residual (residual may be NULL: acc = grad), in float32 (_f32) or float64
// (_f64):
//   count:  number of i with |acc[i]| >= threshold (NaN never counts).
//   select: for those i, in increasing order, values[j] = acc[i] and indices[j] = i (int32
//           when index_bytes == 4, else int64); new_residual[i] = acc[i] - acc[i] there (0, or
//           NaN for inf, as numpy's acc - scatter(values) gives) and acc[i] elsewhere.
//           new_residual may be NULL, or alias residual. values/indices need room for n
//           entries (only the selected ones are written: untouched pages cost nothing).
//           Returns the number selected.
DLC_API int64_t dlc_count_above_f32(const float* grad, const float* residual, int64_t n,
                                    float threshold);
DLC_API int64_t dlc_count_above_f64(const double* grad, const double* residual, int64_t n,
                                    double threshold);
// momentum_count_above: velocity[i] = velocity[i] * momentum + grad[i] (numpy's v *= m;
//   v += g, two roundings), then count as count_above over acc = velocity + residual: the
//   momentum update of error feedback's momentum correction folded into the first count.
DLC_API int64_t dlc_momentum_count_above_f32(float* velocity, const float* grad, float momentum,
                                             const float* residual, int64_t n,
                                             float threshold);
DLC_API int64_t dlc_momentum_count_above_f64(double* velocity, const double* grad,
                                             double momentum, const double* residual,
                                             int64_t n, double threshold);
DLC_API int64_t dlc_ef_select_f32(const float* grad, const float* residual, int64_t n,
                                  float threshold, float* values, void* indices,
                                  int index_bytes, float* new_residual);
DLC_API int64_t dlc_ef_select_f64(const double* grad, const double* residual, int64_t n,
                                  double threshold, double* values, void* indices,
                                  int index_bytes, double* new_residual);

// ---- sparse into dense, and momentum correction's step (native/scatter.cpp) -----------
// scatter_add: numpy's out[indices] += values on a flat out of n elements (int32 indices
//   when index_bytes == 4, else int64): all k sums are read before any is written, so a
//   repeated index keeps its last sum. Returns -1, writing nothing, when an index lies
//   outside [0, n) (numpy would wrap a negative one or raise); 0 otherwise.
DLC_API int64_t dlc_scatter_add_f32(float* out, int64_t n, const float* values,
                                    const void* indices, int index_bytes, int64_t k);
DLC_API int64_t dlc_scatter_add_f64(double* out, int64_t n, const double* values,
                                    const void* indices, int index_bytes, int64_t k);
// velocity_step: r = result[i]; result[i] = kept[i] * scale + r (two roundings, as numpy's
//   kept *= scale; kept += result); kept[i] = r. One pass where numpy makes three.
DLC_API void dlc_velocity_step_f32(float* result, float* kept, int64_t n, float scale);
DLC_API void dlc_velocity_step_f64(double* result, double* kept, int64_t n, double scale);

#ifdef __cplusplus
}  // extern "C"

// ---- internal helpers shared by the .cpp files ------------------------------------------
#include <omp.h>

namespace dlc {

// Elements below which kernels stay on one thread (thread start-up costs more).
constexpr int64_t kParallelMin = int64_t(1) << 18;
int threads_for(int64_t n);
bool simd_enabled();

// Runs body(lo, hi) over [0, n) in one contiguous chunk per OpenMP thread.
template <class Body>
void chunked(int64_t n, Body body) {
  const int threads = dlc::threads_for(n);
  if (threads <= 1) {
    body(int64_t(0), n);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    // Chunk edges on multiples of 64 elements keep SIMD blocks and cache lines whole.
    const int64_t per = ((n + nt - 1) / nt + 63) / 64 * 64;
    const int64_t lo = t * per < n ? t * per : n;
    const int64_t hi = lo + per < n ? lo + per : n;
    if (lo < hi) body(lo, hi);
  }
}


inline uint32_t float_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
inline float bits_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

// numpy's float32 -> float16 bit conversion (round to nearest even, NaN kept unquieted).
inline uint16_t f32_bits_to_f16(uint32_t f) {
  const uint32_t sign = (f >> 16) & 0x8000u;
  const uint32_t a = f & 0x7fffffffu;
  if (a >= 0x7f800000u) {  // inf or NaN
    if (a == 0x7f800000u) return uint16_t(sign | 0x7c00u);
    uint32_t payload = (a & 0x007fffffu) >> 13;
    return uint16_t(sign | 0x7c00u | (payload ? payload : 1u));
  }
  if (a >= 0x47800000u) return uint16_t(sign | 0x7c00u);  // >= 65536: overflow
  if (a >= 0x38800000u) {  // normal half (carry into the exponent may reach inf: correct)
    const uint32_t rounded = a + 0x0fffu + ((a >> 13) & 1u);
    return uint16_t(sign | ((rounded - 0x38000000u) >> 13));
  }
  if (a < 0x33000000u) return uint16_t(sign);  // below 2^-25: rounds to zero
  const uint32_t e = a >> 23;                    // 102..112: half subnormal
  const uint32_t m = (a & 0x007fffffu) | 0x00800000u;
  const uint32_t shift = 126u - e;               // 14..24
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1u);
  if (rem > halfway || (rem == halfway && (q & 1u))) ++q;
  return uint16_t(sign | q);
}

// numpy's float16 -> float32 bit conversion (exact; NaN payload kept unquieted).
inline uint32_t f16_to_f32_bits(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t e = h & 0x7c00u;
  const uint32_t m = h & 0x03ffu;
  if (e == 0x7c00u) return sign | 0x7f800000u | (m << 13);
  if (e != 0) return sign | ((uint32_t(h & 0x7fffu) + 0x1c000u) << 13);
  if (m == 0) return sign;
  return sign | float_bits(float(m) * 5.9604644775390625e-08f);  // m * 2^-24, exact
}

inline bool f16_is_nan(uint16_t h) { return (h & 0x7fffu) > 0x7c00u; }

// numpy's float16 add (in1 = a, in2 = b) with its NaN choice made explicit, so compilers
// that commute the float add cannot change which NaN comes out.
inline uint16_t f16_add(uint16_t a, uint16_t b) {
  if (f16_is_nan(b)) return uint16_t(b | 0x0200u);
  if (f16_is_nan(a)) return uint16_t(a | 0x0200u);
  const float s = bits_float(f16_to_f32_bits(a)) + bits_float(f16_to_f32_bits(b));
  if (s != s) return 0xfe00u;  // inf + -inf: x86's default NaN, as numpy produces
  return f32_bits_to_f16(float_bits(s));
}

inline uint16_t f32_bits_to_bf16(uint32_t bits) {
  if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;
  return uint16_t((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

}  // namespace dlc
#endif  // __cplusplus
#endif  // DLCOMM_NATIVE_H
