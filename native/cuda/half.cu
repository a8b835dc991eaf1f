// float16/bfloat16 kernels for CuPy's RawKernel (extern "C", one element per thread).
// UNTESTED here (no GPU on the development machine): dlcomm does not load these yet; the
// CuPy path uses CuPy's own astype and add. Semantics follow native/dlcomm_native.h, except
// that CUDA's conversions quiet signalling NaNs (numpy keeps them).
#include <cuda_fp16.h>

extern "C" __global__ void dlc_f16_add_inplace(const __half* a, __half* b, long long n) {
  const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) b[i] = __float2half_rn(__half2float(a[i]) + __half2float(b[i]));
}

extern "C" __global__ void dlc_f32_to_bf16(const unsigned int* in, unsigned short* out,
                                           long long n) {
  const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= n) return;
  const unsigned int bits = in[i];
  out[i] = (bits & 0x7fffffffu) > 0x7f800000u
               ? (unsigned short)0x7fc0u
               : (unsigned short)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}
