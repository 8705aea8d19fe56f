// Matrix products for the CPU kernels: thin row-major wrappers over OpenBLAS sgemm or oneDNN's
// matmul (train.gemm), a batched product, and the nn.Linear forward/backward built on them (the
// bulk of a GPT's FLOPs). These are the one exception to the kernels' thread-count independence:
// either library may block a product differently with a different number of threads, changing
// the last bits.
#pragma once

#include <cstdint>
#include <string>

namespace meshtrain::cpu {

// Row-major c[M, N] = alpha * op(a) @ op(b) + beta * c with explicit leading dimensions, the one
// place that calls sgemm. OpenBLAS applies beta = 0 by a separate scaling pass over c that
// measured several times slower than memset (30-100 us extra on a 1024x128 product, 1024x128x512:
// 1533 us against 1502 us for memset + beta = 1), so beta = 0 zero-fills c and accumulates.
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// out[M, N] = alpha * op(a) @ op(b) + beta * out, all row-major and contiguous. op(a) is [M, K]:
// a is stored [M, K], or [K, M] when trans_a. op(b) is [K, N]: b is [K, N], or [N, K] when trans_b.
void matmul(float* out, const float* a, const float* b, int64_t M, int64_t N, int64_t K,
            bool trans_a, bool trans_b, float alpha = 1.0f, float beta = 0.0f);

// The same product for `batch` independent matrices located stride_out / stride_a / stride_b
// floats apart. Small matrices (< 2^22 multiply-adds) are spread over OpenMP threads, one
// single-threaded sgemm each; large ones run one after another with OpenBLAS threading inside.
// Measured at 2 threads, 32 products of 128x128x32: 0.30-0.43 ms spread, 0.91-0.98 ms with
// OpenBLAS threading each (0.59 ms on one thread).
void matmul_batched(float* out, const float* a, const float* b, int64_t batch, int64_t M, int64_t N,
                    int64_t K, bool trans_a, bool trans_b, int64_t stride_out, int64_t stride_a,
                    int64_t stride_b, float alpha = 1.0f, float beta = 0.0f);

// nn.Linear: out[BT, C_out] = inp[BT, C_in] @ weight[C_out, C_in]^T + bias[C_out].
// bias may be nullptr.
void linear_forward(float* out, const float* inp, const float* weight, const float* bias,
                    int64_t BT, int64_t C_in, int64_t C_out);

// Accumulates dinp[BT, C_in] += dout @ weight, dweight[C_out, C_in] += dout^T @ inp and
// dbias[C_out] += column sums of dout. Each of dinp, dweight, dbias may be nullptr.
void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int64_t BT, int64_t C_in, int64_t C_out);

// Which library runs gemm (and so every product above): oneDNN's matmul (gemm_onednn.h, the
// default: on this project's AVX-512 machines 1.6-2.0x OpenBLAS's sgemm on a GPT's products) or
// OpenBLAS's sgemm. Process-wide, set from train.gemm; the two differ in the last bits.
enum class GemmBackend { openblas, onednn };
void set_gemm_backend(GemmBackend backend);
GemmBackend gemm_backend();

// The BLAS behind gemm and the kernels it picked for this CPU, e.g. "OpenBLAS 0.3.21 DYNAMIC_ARCH
// NO_AFFINITY Haswell MAX_THREADS=64": OpenBLAS chooses its kernels when loaded (OPENBLAS_CORETYPE
// overrides the choice), and they set the speed of most of a training step.
std::string blas_config();
// What runs the products now: "BLAS " + blas_config(), or "GEMM " + the oneDNN version and kernel.
std::string gemm_config();

}  // namespace meshtrain::cpu
