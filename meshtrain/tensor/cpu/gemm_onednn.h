// cpu::gemm through oneDNN's matmul: each product shape gets its primitive (the kernel oneDNN
// picks for this CPU at run time, JIT-compiled) once per thread and keeps it; a call only points
// the primitive at the caller's arrays and runs it. On CPUs with AVX-512 its kernels run the
// products of a GPT step 1.6-2.0x faster than OpenBLAS's (kernel_bench --gemm,
// bench/train_sweep.sh, docs/benchmarks.md).
#pragma once

#include <cstdint>
#include <string>

namespace meshtrain::cpu::gemm_onednn {

// While one is alive on a thread, that thread's products are built for any row count: one
// primitive (oneDNN's gemm:jit with run-time dimensions) serves every M of a product of rows
// and every K of a weight gradient (op(a) transposed), where building a primitive for each new
// shape (100-400 us of JIT compilation) would cost more than the product. For layers whose row
// count changes every step: a mixture of experts' per-expert rows. The products of rows give the
// bits the shape's own primitive gives (brgemm and gemm:jit sum K alike when K is a layer's
// width); a weight gradient's sum over the rows may round differently.
class RowsVary {
 public:
  RowsVary();
  ~RowsVary();
  RowsVary(const RowsVary&) = delete;
  RowsVary& operator=(const RowsVary&) = delete;
};

// cpu::gemm's contract (row-major, leading dimensions, alpha, beta) for K > 0.
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// The oneDNN version and the kernel it runs for a typical product, e.g. "oneDNN 2.6.3
// brg:avx512_core".
std::string config();

}  // namespace meshtrain::cpu::gemm_onednn
