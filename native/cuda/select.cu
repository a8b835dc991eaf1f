// Error-feedback threshold selection for CuPy's RawKernel: acc = grad + residual; picks with
// |acc| >= threshold are appended through an atomic counter (order NOT sorted: sort the
// indices afterwards to match the CPU kernel); new_residual = acc - acc there, acc elsewhere.
// UNTESTED here (no GPU on the development machine); not loaded by dlcomm yet.
extern "C" __global__ void dlc_ef_select_f32(const float* grad, const float* residual,
                                             long long n, float threshold, float* values,
                                             int* indices, unsigned long long* count,
                                             float* new_residual) {
  const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float acc = residual ? grad[i] + residual[i] : grad[i];
  const bool pick = fabsf(acc) >= threshold;
  if (pick) {
    const unsigned long long w = atomicAdd(count, 1ull);
    values[w] = acc;
    indices[w] = (int)i;
  }
  new_residual[i] = pick ? acc - acc : acc;
}
