// cpu::KernelTimer: each kernel's time goes to its kind on the calling thread, only while timing
// is on; a kernel inside another is charged to the outer one, and kernels run inside an OpenMP
// region are not counted again.
#include <gtest/gtest.h>
#include <omp.h>

#include <vector>

#include "meshtrain/tensor/cpu/adamw.h"
#include "meshtrain/tensor/cpu/attention.h"
#include "meshtrain/tensor/cpu/gelu.h"
#include "meshtrain/tensor/cpu/gemm.h"
#include "meshtrain/tensor/cpu/kernel_clock.h"

namespace meshtrain::cpu {
namespace {

constexpr int64_t kN = 128;

void square_matmul(std::vector<float>& out, const std::vector<float>& a) {
  matmul(out.data(), a.data(), a.data(), kN, kN, kN, false, false, 1.0f, 0.0f);
}

TEST(KernelClock, NothingIsCountedWhileTimingIsOff) {
  std::vector<float> a(kN * kN, 0.5f), out(kN * kN);
  take_kernel_seconds();
  square_matmul(out, a);
  for (double s : take_kernel_seconds()) EXPECT_EQ(s, 0.0);
}

TEST(KernelClock, EachKernelGoesToItsKindAndTakeStartsAfresh) {
  const KernelTimingScope timing(true);
  take_kernel_seconds();
  std::vector<float> a(kN * kN, 0.5f), out(kN * kN);
  square_matmul(out, a);
  KernelSeconds k = take_kernel_seconds();
  EXPECT_GT(k[static_cast<size_t>(KernelKind::gemm)], 0.0);
  EXPECT_EQ(k[static_cast<size_t>(KernelKind::attention)], 0.0);
  EXPECT_EQ(k[static_cast<size_t>(KernelKind::elementwise)], 0.0);
  EXPECT_EQ(k[static_cast<size_t>(KernelKind::optimizer)], 0.0);
  for (double s : take_kernel_seconds()) EXPECT_EQ(s, 0.0);

  std::vector<float> g(kN * kN);
  gelu_forward(g.data(), a.data(), kN * kN);
  k = take_kernel_seconds();
  EXPECT_GT(k[static_cast<size_t>(KernelKind::elementwise)], 0.0);
  EXPECT_EQ(k[static_cast<size_t>(KernelKind::gemm)], 0.0);

  std::vector<float> m(kN, 0.0f), v(kN, 0.0f), p(kN, 1.0f);
  adamw_step(p.data(), a.data(), m.data(), v.data(), kN, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1);
  k = take_kernel_seconds();
  EXPECT_GT(k[static_cast<size_t>(KernelKind::optimizer)], 0.0);
  EXPECT_EQ(k[static_cast<size_t>(KernelKind::elementwise)], 0.0);
}

TEST(KernelClock, AttentionsInnerProductsAreChargedToAttention) {
  const KernelTimingScope timing(true);
  const int64_t B = 2, T = 64, C = 64, NH = 4;
  std::vector<float> qkv(B * T * 3 * C, 0.25f), out(B * T * C), att(B * NH * T * T);
  take_kernel_seconds();
  attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  const KernelSeconds k = take_kernel_seconds();
  EXPECT_GT(k[static_cast<size_t>(KernelKind::attention)], 0.0);
  EXPECT_EQ(k[static_cast<size_t>(KernelKind::gemm)], 0.0);
  EXPECT_EQ(k[static_cast<size_t>(KernelKind::elementwise)], 0.0);
}

TEST(KernelClock, KernelsInsideAParallelRegionAreNotCountedByItsThreads) {
  const KernelTimingScope timing(true);
  std::vector<float> a(kN * kN, 0.5f);
  std::vector<double> counted(2, -1.0);
#pragma omp parallel num_threads(2)
  {
    take_kernel_seconds();
    std::vector<float> g(kN * kN);
    gelu_forward(g.data(), a.data(), kN * kN);
    double sum = 0.0;
    for (double s : take_kernel_seconds()) sum += s;
    counted[static_cast<size_t>(omp_get_thread_num())] = sum;
  }
  for (double s : counted) EXPECT_EQ(s, 0.0);
}

TEST(KernelClock, TheScopeTurnsTimingBackOff) {
  {
    const KernelTimingScope timing(true);
    EXPECT_TRUE(kernel_timing());
  }
  EXPECT_FALSE(kernel_timing());
  const KernelTimingScope unchanged(false);
  EXPECT_FALSE(kernel_timing());
}

}  // namespace
}  // namespace meshtrain::cpu
