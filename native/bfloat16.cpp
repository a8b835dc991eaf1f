// bfloat16 (uint16 bit patterns) <-> float32 and the bfloat16 in-place sum, equal to the numpy
// reference in dlcomm/bfloat16.py (round to nearest even, every NaN -> 0x7FC0).
// Branch-free loops: GCC vectorises them; target_clones adds an AVX2 copy picked at load time.
#include "dlcomm_native.h"

namespace {

__attribute__((target_clones("avx2", "default")))
void f32_to_bf16_range(const float* in, uint16_t* out, int64_t lo, int64_t hi) {
  for (int64_t i = lo; i < hi; ++i) out[i] = dlc::f32_bits_to_bf16(dlc::float_bits(in[i]));
}

__attribute__((target_clones("avx2", "default")))
void bf16_to_f32_range(const uint16_t* in, float* out, int64_t lo, int64_t hi) {
  for (int64_t i = lo; i < hi; ++i) out[i] = dlc::bits_float(uint32_t(in[i]) << 16);
}

__attribute__((target_clones("avx2", "default")))
void bf16_add_range(const uint16_t* a, uint16_t* b, int64_t lo, int64_t hi) {
  for (int64_t i = lo; i < hi; ++i) {
    const float s = dlc::bits_float(uint32_t(a[i]) << 16) + dlc::bits_float(uint32_t(b[i]) << 16);
    b[i] = dlc::f32_bits_to_bf16(dlc::float_bits(s));
  }
}

}  // namespace

extern "C" {

void dlc_f32_to_bf16(const float* in, uint16_t* out, int64_t n) {
  dlc::chunked(n, [&](int64_t lo, int64_t hi) { f32_to_bf16_range(in, out, lo, hi); });
}

void dlc_bf16_to_f32(const uint16_t* in, float* out, int64_t n) {
  dlc::chunked(n, [&](int64_t lo, int64_t hi) { bf16_to_f32_range(in, out, lo, hi); });
}

void dlc_bf16_add_inplace(const uint16_t* a, uint16_t* b, int64_t n) {
  dlc::chunked(n, [&](int64_t lo, int64_t hi) { bf16_add_range(a, b, lo, hi); });
}

}  // extern "C"
