// Sign pack/unpack for CuPy's RawKernel, np.packbits(x >= 0) bit order (element 8j+k is bit
// 7-k of byte j). UNTESTED here (no GPU on the development machine); not loaded by dlcomm yet.
extern "C" __global__ void dlc_sign_pack_f32(const float* x, unsigned char* out, long long n) {
  const long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x;  // one byte each
  if (8 * j >= n) return;
  unsigned char byte = 0;
  for (int k = 0; k < 8; ++k) {
    const long long i = 8 * j + k;
    if (i < n && x[i] >= 0.0f) byte |= (unsigned char)(0x80u >> k);
  }
  out[j] = byte;
}

extern "C" __global__ void dlc_sign_unpack_f32(const unsigned char* packed, long long n,
                                               float pos, float neg, float* out) {
  const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) out[i] = ((packed[i >> 3] >> (7 - (i & 7))) & 1) ? pos : neg;
}
