// The Python module of the kernels: one build per instruction set (shared/model/kernels/
// __init__.py), every entry point of kernels.h plus the fused decode step. The only source
// besides decode_stack.cpp that includes pybind11, the slow header to compile.
#include <torch/csrc/utils/pybind.h>

#include "kernels.h"

void register_decode_stack(pybind11::module_& m);  // decode_stack.cpp

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // NOTE: these release the GIL themselves, and only for work long enough to repay the
  // hand-over (cpu_ops.cpp's GilRelease); prompt attention and the quantized ones always
  // run long enough.
  m.def("rms_norm", &kernels::rms_norm);
  m.def("add_rms_norm_", &kernels::add_rms_norm_);
  m.def("silu_and_mul", &kernels::silu_and_mul);
  m.def("rotary_", &kernels::rotary_);
  m.def("write_kv", &kernels::write_kv);
  m.def("decode_attention", &kernels::decode_attention);
  m.def("small_linear", &kernels::small_linear);
  using release = pybind11::call_guard<pybind11::gil_scoped_release>;
  m.def("prefill_attention", &kernels::prefill_attention, pybind11::arg("out"),
        pybind11::arg("q"), pybind11::arg("k"), pybind11::arg("v"), pybind11::arg("scale"),
        pybind11::arg("bf16_products") = false, release());
  m.def("prefill_attention_has_bf16_products", &kernels::prefill_attention_has_bf16_products);
  m.def("quant_gemv", &kernels::quant_gemv, release());
  m.def("quant_gemm", &kernels::quant_gemm, release());
  m.def("quant_dequantize", &kernels::quant_dequantize, release());
  m.def("quant_interleave", &kernels::quant_interleave, release());
  m.def("quant_lookup", &kernels::quant_lookup, release());
  m.def("quant_gemv_int", &kernels::quant_gemv_int, release());
  m.def("quant_round_rows", &kernels::quant_round_rows, release());
  m.def("set_weight_prefetch", &kernels::set_weight_prefetch);
  m.def("set_kv_prefetch", &kernels::set_kv_prefetch);
  m.def("set_gemv_x16", &kernels::set_gemv_x16);
  m.def("greedy_rows", &kernels::greedy_rows);
  register_decode_stack(m);
}
