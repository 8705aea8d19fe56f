// The reference convolution: per image and group, im2col into a [C_in/G * KH * KW, OH * OW] column
// matrix and one matmul with the group's weights. Plain enough to check by eye; the tests check it
// against direct loops in double and hold oneDNN to it. It allocates its column matrix on the heap,
// unlike the other kernels: it is the oracle, not the training path.
#include <algorithm>
#include <vector>

#include "meshtrain/tensor/cpu/conv2d_impl.h"
#include "meshtrain/tensor/cpu/gemm.h"

namespace meshtrain::cpu::conv2d_reference {
namespace {

struct Dims {
  int64_t Cg, Og, OH, OW, OHW, rows;  // rows of the column matrix: Cg * KH * KW
  explicit Dims(const Conv2dShape& s)
      : Cg(s.C_in / s.groups),
        Og(s.C_out / s.groups),
        OH(s.out_h()),
        OW(s.out_w()),
        OHW(OH * OW),
        rows(Cg * s.KH * s.KW) {}
};

// col[(c * KH + kh) * KW + kw, oh * OW + ow] = x[c, oh * stride - pad + kh * dil, ...], zero where
// the window hangs over the padding. x points at the group's first channel of one image.
void im2col(float* col, const float* x, const Conv2dShape& s, const Dims& d) {
  for (int64_t c = 0; c < d.Cg; ++c)
    for (int64_t kh = 0; kh < s.KH; ++kh)
      for (int64_t kw = 0; kw < s.KW; ++kw) {
        float* row = col + ((c * s.KH + kh) * s.KW + kw) * d.OHW;
        for (int64_t oh = 0; oh < d.OH; ++oh) {
          const int64_t ih = oh * s.stride_h - s.pad_h + kh * s.dil_h;
          for (int64_t ow = 0; ow < d.OW; ++ow) {
            const int64_t iw = ow * s.stride_w - s.pad_w + kw * s.dil_w;
            const bool inside = ih >= 0 && ih < s.H && iw >= 0 && iw < s.W;
            row[oh * d.OW + ow] = inside ? x[(c * s.H + ih) * s.W + iw] : 0.0f;
          }
        }
      }
}

// The adjoint of im2col: dx[c, ih, iw] += every column entry that was read from it.
void col2im(float* dx, const float* col, const Conv2dShape& s, const Dims& d) {
  for (int64_t c = 0; c < d.Cg; ++c)
    for (int64_t kh = 0; kh < s.KH; ++kh)
      for (int64_t kw = 0; kw < s.KW; ++kw) {
        const float* row = col + ((c * s.KH + kh) * s.KW + kw) * d.OHW;
        for (int64_t oh = 0; oh < d.OH; ++oh) {
          const int64_t ih = oh * s.stride_h - s.pad_h + kh * s.dil_h;
          if (ih < 0 || ih >= s.H) continue;
          for (int64_t ow = 0; ow < d.OW; ++ow) {
            const int64_t iw = ow * s.stride_w - s.pad_w + kw * s.dil_w;
            if (iw >= 0 && iw < s.W) dx[(c * s.H + ih) * s.W + iw] += row[oh * d.OW + ow];
          }
        }
      }
}

}  // namespace

void forward(float* out, const float* inp, const float* weight, const float* bias,
             const Conv2dShape& s) {
  const Dims d(s);
  std::vector<float> col(static_cast<size_t>(d.rows * d.OHW));
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t g = 0; g < s.groups; ++g) {
      im2col(col.data(), inp + (n * s.C_in + g * d.Cg) * s.H * s.W, s, d);
      float* y = out + (n * s.C_out + g * d.Og) * d.OHW;
      matmul(y, weight + g * d.Og * d.rows, col.data(), d.Og, d.OHW, d.rows, false, false);
      if (bias != nullptr)
        for (int64_t o = 0; o < d.Og; ++o)
          for (int64_t i = 0; i < d.OHW; ++i) y[o * d.OHW + i] += bias[g * d.Og + o];
    }
}

void backward_data(float* dinp, const float* dout, const float* weight, const Conv2dShape& s) {
  const Dims d(s);
  std::vector<float> col(static_cast<size_t>(d.rows * d.OHW));
  std::fill_n(dinp, s.N * s.C_in * s.H * s.W, 0.0f);
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t g = 0; g < s.groups; ++g) {
      // dcol[rows, OHW] = weight_g[Og, rows]^T @ dout_g[Og, OHW].
      matmul(col.data(), weight + g * d.Og * d.rows, dout + (n * s.C_out + g * d.Og) * d.OHW,
             d.rows, d.OHW, d.Og, true, false);
      col2im(dinp + (n * s.C_in + g * d.Cg) * s.H * s.W, col.data(), s, d);
    }
}

void backward_weights(float* dweight, float* dbias, const float* dout, const float* inp,
                      const Conv2dShape& s) {
  const Dims d(s);
  if (dweight != nullptr) {
    std::vector<float> col(static_cast<size_t>(d.rows * d.OHW));
    std::fill_n(dweight, s.C_out * d.rows, 0.0f);
    for (int64_t n = 0; n < s.N; ++n)
      for (int64_t g = 0; g < s.groups; ++g) {
        im2col(col.data(), inp + (n * s.C_in + g * d.Cg) * s.H * s.W, s, d);
        // dweight_g[Og, rows] += dout_g[Og, OHW] @ col[rows, OHW]^T.
        matmul(dweight + g * d.Og * d.rows, dout + (n * s.C_out + g * d.Og) * d.OHW, col.data(),
               d.Og, d.rows, d.OHW, false, true, 1.0f, 1.0f);
      }
  }
  if (dbias != nullptr) {
    for (int64_t o = 0; o < s.C_out; ++o) {
      double acc = 0.0;
      for (int64_t n = 0; n < s.N; ++n) {
        const float* g = dout + (n * s.C_out + o) * d.OHW;
        for (int64_t i = 0; i < d.OHW; ++i) acc += g[i];
      }
      dbias[o] = static_cast<float>(acc);
    }
  }
}

}  // namespace meshtrain::cpu::conv2d_reference
