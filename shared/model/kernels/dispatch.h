// The element types the kernels load and store (simd.h's loads): float32, bfloat16, float16.
#pragma once

#include <ATen/Dispatch.h>

#define KV_DISPATCH(TYPE, NAME, ...)                            \
  AT_DISPATCH_SWITCH(TYPE, NAME,                                \
                     AT_DISPATCH_CASE(at::kFloat, __VA_ARGS__)  \
                     AT_DISPATCH_CASE(at::kBFloat16, __VA_ARGS__) \
                     AT_DISPATCH_CASE(at::kHalf, __VA_ARGS__))
