// The two implementations behind conv2d.h, each in its own file; conv2d.cpp chooses between them.
// Callers include conv2d.h, never this.
#pragma once

#include "meshtrain/tensor/cpu/conv2d.h"

namespace meshtrain::cpu::conv2d_reference {

void forward(float* out, const float* inp, const float* weight, const float* bias,
             const Conv2dShape& s);
void backward_data(float* dinp, const float* dout, const float* weight, const Conv2dShape& s);
void backward_weights(float* dweight, float* dbias, const float* dout, const float* inp,
                      const Conv2dShape& s);

}  // namespace meshtrain::cpu::conv2d_reference

namespace meshtrain::cpu::conv2d_onednn {

void forward(float* out, const float* inp, const float* weight, const float* bias,
             const Conv2dShape& s);
void forward_inference(float* out, const float* inp, const float* weight, const float* bias,
                       const Conv2dShape& s, bool relu);
void backward_data(float* dinp, const float* dout, const float* weight, const Conv2dShape& s);
void backward_weights(float* dweight, float* dbias, const float* dout, const float* inp,
                      const Conv2dShape& s);
ConvCacheStats cache_stats();
std::string config();

}  // namespace meshtrain::cpu::conv2d_onednn
