// A decode step of a Llama-family model in one call: the tokens' embeddings, every layer, the
// final norm and (where the module path's head is a quantized GEMV) the logits. Each part runs
// the kernels the module path runs (shared/model/llama.py over the torch paged attention
// backend), in its order and on buffers of the same shapes, so the results are bit-identical;
// what it saves is the Python and the torch dispatch around some 300 small kernel calls a
// step, each of which paid cold caches after the weights had streamed through them.
// Built once per model and KV pool by shared/model/fused_decode.py.
//
// The activations and the KV cache share one dtype, float32 or bfloat16. The GEMVs compute in
// float32 whatever it is, as QuantLinear does (x widened, y rounded back), and a bfloat16
// stack runs its MLP in float32 between those roundings, as GatedMLP does (shared/model/
// layers.py: its matmuls' dtype is the GEMV's).
//
// A float32 stack's step "by copy" multiplies every linear by its kept bfloat16 copy instead,
// as the module path does for rows from a copy's copy_min_rows on (QuantLinear.linear_bf16:
// rows rounded to bfloat16, the library's GEMM, the MLP in bfloat16 between its two).
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <torch/csrc/utils/pybind.h>

#include "kernels.h"
#include "parallel.h"
#include "quant_blocks.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

namespace {

namespace py = pybind11;

constexpr int64_t kFloatWeight = -1;  // Linear::qtype of a float32 weight
constexpr int64_t kMaxRows = 16;  // decode rows a step takes (fused_decode.py's MAX_ROWS)
// decode rows a step by copy takes: no register tiles bound it, only the buffers' size
constexpr int64_t kMaxCopyRows = 1024;

// y = x @ W^T (+ b) by oneDNN's GEMM over a weight it packed (PrefillWeight in shared/model/
// quant.py): the op torch.ops.mkldnn._linear_pointwise calls.
at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& w,
                         const c10::optional<at::Tensor>& bias) {
  using Signature = at::Tensor(const at::Tensor&, const at::Tensor&,
                               const c10::optional<at::Tensor>&, c10::string_view,
                               c10::List<c10::optional<at::Scalar>>,
                               c10::optional<c10::string_view>);
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
                             .typed<Signature>();
  return op.call(x, w, bias, "none", c10::List<c10::optional<at::Scalar>>(),
                 c10::string_view(""));
}

// A kept bfloat16 copy of a linear's weight [N, K] and its bias in bfloat16, which many rows
// multiply by: packed by oneDNN (packed_linear) or plain (at::linear), as PrefillWeight says.
struct Copy {
  at::Tensor weight;
  c10::optional<at::Tensor> bias;
  bool packed;

  // x bfloat16 [B, K] -> bfloat16 [B, N]
  at::Tensor operator()(const at::Tensor& x) const {
    return packed ? packed_linear(x, weight, bias) : at::linear(x, weight, bias);
  }
};

// y = x @ W^T (+ b): W float32 [N, K] (small_linear) or GGUF blocks [N, row_bytes] of `qtype`
// (quant_gemv; quant_gemv_int when the activations are rounded to `bits`: 8 or 16, 0: not).
// A quantized one's x and y are float32, the GEMV's own (DecodeStack::linear widens and
// rounds a bfloat16 stack's around it).
struct Linear {
  at::Tensor weight;
  int64_t qtype;
  int64_t bits;
  c10::optional<at::Tensor> bias;
  c10::optional<Copy> copy;  // what a step by copy multiplies by

  void operator()(const at::Tensor& out, const at::Tensor& x) const {
    if (qtype == kFloatWeight)
      kernels::small_linear(out, x, weight, bias);
    else if (bits)
      kernels::quant_gemv_int(out, x, weight, qtype, bias, bits, false);
    else
      kernels::quant_gemv(out, x, weight, qtype, bias);
  }

  void check(int64_t K, int64_t N, const char* name) const {
    if (qtype == kFloatWeight) {
      TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kFloat &&
                      weight.is_contiguous() && weight.size(1) == K,
                  "DecodeStack: ", name, " weight must be contiguous float32 [", N, ", ", K,
                  "], got ", weight.scalar_type(), " ", weight.sizes());
    } else {
      quant_blocks::check_weight(weight, qtype, K);
    }
    TORCH_CHECK(weight.size(0) == N, "DecodeStack: ", name, " has ", weight.size(0),
                " outputs, not ", N);
    TORCH_CHECK(!bias || (bias->scalar_type() == at::kFloat && bias->is_contiguous() &&
                          bias->numel() == N),
                "DecodeStack: ", name, " bias must be float32 [", N, "]");
  }
};

struct Layer {
  at::Tensor input_norm, post_norm;  // float32 [hidden]
  Linear qkv, o, gate_up, down;
};

// The token embedding [vocab, hidden]: a float weight in the stack's dtype (kFloatWeight) or
// GGUF blocks of `qtype` (QuantEmbedding: rows dequantized to float32, then the stack's dtype).
struct Embedding {
  at::Tensor weight;
  int64_t qtype;
};

// What comes after the layers: the final norm's weight, and the logits head where the stack
// computes it (a float32 stack whose head is a quantized GEMV).
struct Ends {
  at::Tensor norm;
  c10::optional<Linear> head;
};

struct Dims {
  int64_t heads, kv_heads, head_dim;
  double eps, scale;  // the norms' epsilon, attention's score scale
};

// A step's activations, allocated once a run and reused by every layer.
// NOTE: the module path allocates each layer's afresh; the values written are the same, and
// some 300 tensor allocations and views a step (a tenth of its time, measured) go away.
struct Buffers {
  at::Tensor h;         // [B, hidden]: a layer's input, normalized, then its output
  at::Tensor qkv;       // [B, (heads + 2 kv_heads) head_dim], and its views:
  at::Tensor q, k, v;   // [B, heads or kv_heads, head_dim]
  at::Tensor attended;  // [B, heads, head_dim], viewed as rows [B, heads head_dim]:
  at::Tensor attended_rows;
  at::Tensor x;         // [B, hidden]: attention's output, then its norm
  at::Tensor gate_up;   // [B, 2 intermediate], float32 whatever the stack's dtype
  at::Tensor act;       // [B, intermediate], float32 too
  at::Tensor x_f, y_f;  // a bfloat16 stack's GEMV input and output, widened: float32 rows
};

// A bfloat16 tensor's values as float32 into `out` (exact), and float32 ones rounded to
// bfloat16 (to nearest even, as torch's .to(torch.bfloat16): QuantLinear's own rounding).
void widen(float* out, const c10::BFloat16* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(x[i]);
}

void round_to(c10::BFloat16* out, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = c10::BFloat16(y[i]);
}

// The parts of a step whose time PartTimes sums, in the order a step runs them.
enum Part {
  kSetup,  // checks, rotary rows, buffers, embeddings, the first norm
  kQkv,
  kAttention,  // rotary, the KV write and decode attention
  kO,
  kNorms,  // the layer's two norms (the post-attention one and the next layer's input one)
  kGateUp,
  kSiluMul,
  kDown,
  kByCopy,  // a layer of a step by copy, whole
  kHead,  // the final norm and the logits
  kParts
};
constexpr std::array<const char*, kParts> kPartNames = {
    "setup", "qkv", "attention", "o", "norms", "gate_up", "silu_mul", "down", "layer by copy",
    "final norm and head"};

// Microseconds each part of the steps took since timing was last turned on (`python -m bench
// step-phases`); off by default, when a part costs one branch.
struct PartTimes {
  using Clock = std::chrono::steady_clock;
  bool on = false;
  int64_t steps = 0;
  std::array<double, kParts> us{};

  // When a part starts (the clock read only while timing is on)
  Clock::time_point start() const { return on ? Clock::now() : Clock::time_point{}; }

  // Adds the time since `from` (start()'s) to `part`.
  void add(Part part, Clock::time_point from) {
    if (on) us[part] += std::chrono::duration<double, std::micro>(Clock::now() - from).count();
  }

  template <class F>
  void time(Part part, const F& f) {
    const auto from = start();
    f();
    add(part, from);
  }
};

// What a step's rows attend with: their rotary cos and sin, and where their KV lives in the
// paged cache.
struct Step {
  at::Tensor cos, sin, slots, block_table, context_lens;
};

// Rows `rows` of a float32 table [P, half] (each below P, checked) -> [B, half].
at::Tensor gather_rows(const at::Tensor& table, const std::vector<int64_t>& rows) {
  const int64_t half = table.size(1);
  at::Tensor out = at::empty({static_cast<int64_t>(rows.size()), half}, table.options());
  for (size_t i = 0; i < rows.size(); ++i)
    std::memcpy(out.data_ptr<float>() + i * half, table.data_ptr<float>() + rows[i] * half,
                half * sizeof(float));
  return out;
}

void check_tensor(const at::Tensor& t, at::ScalarType type, at::IntArrayRef shape,
                  const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == type && t.is_contiguous() &&
                  t.sizes() == shape,
              "DecodeStack.step: ", name, " must be a contiguous CPU ", type, " tensor ", shape,
              ", got ", t.scalar_type(), " ", t.sizes());
}

class DecodeStack {
 public:
  DecodeStack(std::vector<Layer> layers, int64_t heads, int64_t kv_heads, int64_t head_dim,
              double eps, double scale, at::Tensor kv, Embedding embedding, Ends ends)
      : layers_(std::move(layers)),
        dims_{heads, kv_heads, head_dim, eps, scale},
        kv_(kv),
        embedding_(std::move(embedding)),
        ends_(std::move(ends)),
        built_on_(static_cast<pid_t>(syscall(SYS_gettid))) {
    check_model();
    check_ends();
    for (int64_t i = 0; i < kv_.size(0); ++i) {
      k_caches_.push_back(kv_.select(0, i).select(0, 0));
      v_caches_.push_back(kv_.select(0, i).select(0, 1));
    }
  }

  // token_ids [B]: the rows' tokens, each at position context_lens[b] - 1 -> the final
  // norm's output [B, hidden] in the stack's dtype, or with `logits` the head's float32
  // [B, vocab]. cos and sin [P, head_dim / 2] float32: the rotary tables of positions 0..P-1
  // (shared/model/rope.py). Writes each layer's k, v at `slots`. `by_copy`: every linear
  // multiplies by its bfloat16 copy (a float32 stack whose linears all keep one).
  at::Tensor step(at::Tensor token_ids, at::Tensor cos, at::Tensor sin, at::Tensor slots,
                  at::Tensor block_table, at::Tensor context_lens, bool by_copy,
                  bool logits) const {
    const auto setup_start = times_.start();
    check_step(token_ids, cos, sin, slots, block_table, context_lens, by_copy, logits);
    const std::vector<int64_t> positions = positions_of(context_lens);
    const Step step{gather_rows(cos, positions), gather_rows(sin, positions), slots,
                    block_table, context_lens};
    // NOTE: the library's GEMM runs on OpenMP's threads: the pool's would spin beside them
    const kernels::UsePool use(by_copy ? nullptr : pool());
    const int64_t B = token_ids.size(0);
    const Buffers b = buffers(B, kv_.options());
    const at::Tensor residual = embed(token_ids);
    kernels::rms_norm(b.h, residual, layers_[0].input_norm, dims_.eps);
    times_.add(kSetup, setup_start);
    times_.steps += times_.on;
    for (size_t i = 0; i < layers_.size(); ++i) {
      const at::Tensor& norm = layers_[i].input_norm;
      if (i > 0)
        times_.time(kNorms, [&] { kernels::add_rms_norm_(b.h, residual, norm, dims_.eps); });
      if (by_copy)
        times_.time(kByCopy, [&] { layer_by_copy(i, b, residual, step); });
      else
        layer(i, b, residual, step);
    }
    at::Tensor out = b.h;
    times_.time(kHead, [&] {
      kernels::add_rms_norm_(b.h, residual, ends_.norm, dims_.eps);
      if (!logits) return;
      out = at::empty({B, ends_.head->weight.size(0)}, kv_.options());
      (*ends_.head)(out, b.h);
    });
    return out;
  }

  // `steps` greedy steps from token_ids [B] (as step's, logits on the GEMV), each row's next
  // token its logits' first maximum (the sampler's greedy choice, kernels/greedy.cpp), fed to
  // the next step -> [steps, B] int64: the tokens chosen at each step, -1 (the sampler's
  // SAMPLING_FAILED) from a row's first unusable logits on. Each step writes a row's KV at its
  // next position, so block_table must hold context_lens + steps - 1 tokens a row. A nonzero
  // `stop` ([1] uint8, set from another thread) ends the burst after the step in progress:
  // the rows of the steps run come back ([run, B]).
  // NOTE: what it saves is the engine's Python between steps (scheduling, metadata, sampling:
  // ~9% of a batch-1 step, `python -m bench step-phases`); the steps themselves are step's.
  at::Tensor burst(at::Tensor token_ids, at::Tensor cos, at::Tensor sin, at::Tensor block_table,
                   at::Tensor context_lens, int64_t steps,
                   c10::optional<at::Tensor> stop) const {
    check_burst(token_ids, block_table, context_lens, steps);
    TORCH_CHECK(!stop || (stop->device().is_cpu() && stop->scalar_type() == at::kByte &&
                          stop->numel() == 1),
                "DecodeStack.burst: stop must be a CPU uint8 tensor of one element");
    const uint8_t* stop_flag = stop ? stop->data_ptr<uint8_t>() : nullptr;
    const int64_t B = token_ids.size(0);
    at::Tensor ids = token_ids.clone(), lens = context_lens.clone();
    at::Tensor slots = at::empty({B}, lens.options());
    at::Tensor chosen = at::empty({steps, B}, lens.options());
    std::vector<bool> failed(B, false);
    for (int64_t s = 0; s < steps; ++s) {
      next_slots(slots, block_table, lens);
      const auto [best, usable] = kernels::greedy_rows(step(ids, cos, sin, slots, block_table,
                                                            lens, /*by_copy=*/false,
                                                            /*logits=*/true));
      int64_t* out = chosen.data_ptr<int64_t>() + s * B;
      for (int64_t b = 0; b < B; ++b) {
        failed[b] = failed[b] || !usable[b];
        out[b] = failed[b] ? -1 : best[b];
        if (!failed[b]) ids.data_ptr<int64_t>()[b] = best[b];  // else a valid id, unread
        lens.data_ptr<int64_t>()[b] += 1;
      }
      if (stop_flag && s + 1 < steps && __atomic_load_n(stop_flag, __ATOMIC_ACQUIRE))
        return chosen.narrow(0, 0, s + 1);
    }
    return chosen;
  }

  // Starts (or stops) timing the steps' parts, from zero.
  void time_parts(bool on) { times_ = PartTimes{on}; }

  // {part: microseconds summed over the steps timed}, and "steps": how many.
  py::dict part_times() const {
    py::dict out;
    for (int p = 0; p < kParts; ++p) out[kPartNames[p]] = times_.us[p];
    out["steps"] = times_.steps;
    return out;
  }

  // Whether the stack computes the logits itself (Ends::head).
  bool has_head() const { return ends_.head.has_value(); }

  // Whether a step may go by copy: a float32 stack whose every linear keeps a bfloat16 copy.
  bool takes_copies() const {
    if (dtype() != at::kFloat) return false;
    for (const Layer& l : layers_)
      for (const Linear* linear : {&l.qkv, &l.o, &l.gate_up, &l.down})
        if (!linear->copy) return false;
    return true;
  }

 private:
  std::vector<Layer> layers_;
  Dims dims_;
  at::Tensor kv_;  // KVStorage.kv: [layers, 2, blocks, block_size, kv_heads, head_dim]
  Embedding embedding_;
  Ends ends_;
  // the activations' and the KV's: float32 or bfloat16 (a bfloat16 one's linears quantized)
  std::vector<at::Tensor> k_caches_, v_caches_;
  mutable std::unique_ptr<kernels::SpinPool> pool_;  // sized to torch's threads when it runs
  mutable PartTimes times_;  // NOTE: a stack steps on one thread at a time (its engine's)
  pid_t built_on_;  // the thread the model was loaded on (its teams live as long as it does)

  // The step's parallel loops run on a pool of as many threads as torch's count for this
  // thread, where OpenMP would throttle them (parallel.h). Not on the process's first thread
  // nor on the thread the model was built on (the services' EngineThread), whose teams are
  // the process's only ones and spin: there the pool's workers and OpenMP's idle spinning ones
  // would share the cores (decode batch 1 at 2/3 speed: `python -m bench engine-thread`); nor
  // for one thread.
  kernels::SpinPool* pool() const {
    const int threads = at::get_num_threads();
    if (threads <= 1 || !kernels::step_pool_enabled.load()) return nullptr;
    const auto here = static_cast<pid_t>(syscall(SYS_gettid));
    if (here == getpid() || here == built_on_) return nullptr;
    if (!pool_ || pool_->threads() != threads) {
      pool_.reset();  // its threads end before the new ones start: never more than the cores
      pool_ = std::make_unique<kernels::SpinPool>(threads);
    }
    return pool_.get();
  }

  // The rows' embeddings [B, hidden] in the stack's dtype (they become the first residual).
  at::Tensor embed(const at::Tensor& token_ids) const {
    const int64_t B = token_ids.size(0), H = hidden();
    const int64_t* ids = token_ids.data_ptr<int64_t>();
    if (embedding_.qtype == kFloatWeight) {  // rows copied as they are
      at::Tensor x = at::empty({B, H}, kv_.options());
      const int64_t row_bytes = H * static_cast<int64_t>(kv_.element_size());
      const auto* w = static_cast<const char*>(embedding_.weight.data_ptr());
      for (int64_t i = 0; i < B; ++i)
        std::memcpy(static_cast<char*>(x.data_ptr()) + i * row_bytes, w + ids[i] * row_bytes,
                    row_bytes);
      return x;
    }
    at::Tensor rows = at::empty({B, H}, kv_.options().dtype(at::kFloat));
    kernels::quant_lookup(rows, embedding_.weight, token_ids, embedding_.qtype);
    if (dtype() == at::kFloat) return rows;
    at::Tensor x = at::empty({B, H}, kv_.options());
    round_to(x.data_ptr<c10::BFloat16>(), rows.data_ptr<float>(), B * H);
    return x;
  }

  // Each row's slot for the token at its context's last position, from its block table
  // (check_burst has checked that every step's positions lie in it).
  void next_slots(at::Tensor& slots, const at::Tensor& block_table,
                  const at::Tensor& context_lens) const {
    const int64_t width = block_table.size(1), block_size = kv_.size(3);
    const int64_t* table = block_table.data_ptr<int64_t>();
    const int64_t* lens = context_lens.data_ptr<int64_t>();
    int64_t* out = slots.data_ptr<int64_t>();
    for (int64_t b = 0; b < slots.size(0); ++b) {
      const int64_t position = lens[b] - 1;
      out[b] = table[b * width + position / block_size] * block_size + position % block_size;
    }
  }

  // Each decode row's position: the last of its context.
  static std::vector<int64_t> positions_of(const at::Tensor& context_lens) {
    const int64_t* lens = context_lens.data_ptr<int64_t>();
    std::vector<int64_t> positions(context_lens.size(0));
    for (size_t b = 0; b < positions.size(); ++b) positions[b] = lens[b] - 1;
    return positions;
  }

  int64_t hidden() const { return layers_[0].input_norm.numel(); }
  at::ScalarType dtype() const { return kv_.scalar_type(); }
  int64_t intermediate() const { return layers_[0].gate_up.weight.size(0) / 2; }

  Buffers buffers(int64_t B, const at::TensorOptions& options) const {
    const int64_t D = dims_.head_dim, q_size = dims_.heads * D, kv_size = dims_.kv_heads * D;
    Buffers b;
    b.h = at::empty({B, hidden()}, options);
    b.qkv = at::empty({B, q_size + 2 * kv_size}, options);
    b.q = b.qkv.narrow(1, 0, q_size).view({B, dims_.heads, D});
    b.k = b.qkv.narrow(1, q_size, kv_size).view({B, dims_.kv_heads, D});
    b.v = b.qkv.narrow(1, q_size + kv_size, kv_size).view({B, dims_.kv_heads, D});
    b.attended = at::empty({B, dims_.heads, D}, options);
    b.attended_rows = b.attended.view({B, q_size});
    b.x = at::empty({B, hidden()}, options);
    b.gate_up = at::empty({B, 2 * intermediate()}, options.dtype(at::kFloat));
    b.act = at::empty({B, intermediate()}, options.dtype(at::kFloat));
    if (dtype() != at::kFloat) {
      const int64_t widest = std::max({hidden(), q_size + 2 * kv_size, 2 * intermediate()});
      b.x_f = at::empty({B * widest}, options.dtype(at::kFloat));
      b.y_f = at::empty({B * widest}, options.dtype(at::kFloat));
    }
    return b;
  }

  // One decoder layer from b.h (its input already normalized) back into b.h; the residual
  // advances in place.
  void layer(size_t i, const Buffers& b, const at::Tensor& residual, const Step& step) const {
    const Layer& l = layers_[i];
    times_.time(kQkv, [&] { linear(l.qkv, b.qkv, b.h, b); });
    times_.time(kAttention, [&] { attention(i, b, step); });
    times_.time(kO, [&] { linear(l.o, b.x, b.attended_rows, b); });
    times_.time(kNorms, [&] { kernels::add_rms_norm_(b.x, residual, l.post_norm, dims_.eps); });
    times_.time(kGateUp, [&] { linear(l.gate_up, b.gate_up, b.x, b); });
    times_.time(kSiluMul, [&] { kernels::silu_and_mul(b.act, b.gate_up); });
    times_.time(kDown, [&] { linear(l.down, b.h, b.act, b); });
  }

  // layer() by the linears' bfloat16 copies, as the module path runs such rows: each linear's
  // input rounded to bfloat16 and its output widened back, but the MLP's, which stays in
  // bfloat16 from gate_up's input to down's output (GatedMLP).
  void layer_by_copy(size_t i, const Buffers& b, const at::Tensor& residual,
                     const Step& step) const {
    const Layer& l = layers_[i];
    b.qkv.copy_((*l.qkv.copy)(b.h.to(at::kBFloat16)));
    attention(i, b, step);
    b.x.copy_((*l.o.copy)(b.attended_rows.to(at::kBFloat16)));
    kernels::add_rms_norm_(b.x, residual, l.post_norm, dims_.eps);
    const at::Tensor gate_up = (*l.gate_up.copy)(b.x.to(at::kBFloat16));
    const at::Tensor act = at::empty({gate_up.size(0), intermediate()}, gate_up.options());
    kernels::silu_and_mul(act, gate_up);
    b.h.copy_((*l.down.copy)(act));
  }

  // out = l(x), where either may be bfloat16: widened into b.x_f, rounded back from b.y_f.
  void linear(const Linear& l, const at::Tensor& out, const at::Tensor& x,
              const Buffers& b) const {
    const bool wide_x = x.scalar_type() == at::kFloat, wide_out = out.scalar_type() == at::kFloat;
    if (wide_x && wide_out) {
      l(out, x);
      return;
    }
    const int64_t B = x.size(0), K = x.size(1), N = out.size(1);
    at::Tensor xf = x, yf = out;
    if (!wide_x) {
      xf = b.x_f.narrow(0, 0, B * K).view({B, K});
      widen(xf.data_ptr<float>(), x.data_ptr<c10::BFloat16>(), B * K);
    }
    if (!wide_out) yf = b.y_f.narrow(0, 0, B * N).view({B, N});
    l(yf, xf);
    if (!wide_out) round_to(out.data_ptr<c10::BFloat16>(), yf.data_ptr<float>(), B * N);
  }

  // Rotates q and k inside qkv, writes k and v at the slots, attends into b.attended.
  void attention(size_t i, const Buffers& b, const Step& step) const {
    kernels::rotary_(b.qkv, step.cos, step.sin, dims_.heads + dims_.kv_heads, dims_.head_dim);
    kernels::write_kv(b.k, b.v, k_caches_[i], v_caches_[i], step.slots);
    kernels::decode_attention(b.attended, b.q, k_caches_[i], v_caches_[i], step.block_table,
                              step.context_lens, dims_.scale);
  }

  void check_model() const {
    TORCH_CHECK(!layers_.empty(), "DecodeStack: a model without layers");
    TORCH_CHECK(dims_.heads > 0 && dims_.kv_heads > 0 && dims_.heads % dims_.kv_heads == 0 &&
                    dims_.head_dim > 0 && dims_.head_dim % 2 == 0,
                "DecodeStack: ", dims_.heads, " heads over ", dims_.kv_heads,
                " kv heads of dimension ", dims_.head_dim);
    for (const Layer& l : layers_) check_layer(l);
    const int64_t n = static_cast<int64_t>(layers_.size());
    TORCH_CHECK(dtype() == at::kFloat || dtype() == at::kBFloat16,
                "DecodeStack: kv must be float32 or bfloat16, got ", dtype());
    TORCH_CHECK(kv_.dim() == 6 && kv_.is_contiguous() &&
                    kv_.size(0) == n && kv_.size(1) == 2 && kv_.size(4) == dims_.kv_heads &&
                    kv_.size(5) == dims_.head_dim,
                "DecodeStack: kv must be contiguous [", n, ", 2, blocks, block_size, ",
                dims_.kv_heads, ", ", dims_.head_dim, "], got ", kv_.scalar_type(), " ",
                kv_.sizes());
  }

  void check_layer(const Layer& l) const {
    const int64_t H = hidden(), q = dims_.heads * dims_.head_dim;
    const int64_t kv = dims_.kv_heads * dims_.head_dim;
    for (const at::Tensor* norm : {&l.input_norm, &l.post_norm})
      TORCH_CHECK(norm->dim() == 1 && norm->scalar_type() == dtype() &&
                      norm->is_contiguous() && norm->numel() == H,
                  "DecodeStack: norm weights must be ", dtype(), " [", H, "]");
    for (const Linear* linear : {&l.qkv, &l.o, &l.gate_up, &l.down})
      TORCH_CHECK(dtype() == at::kFloat || linear->qtype != kFloatWeight,
                  "DecodeStack: a ", dtype(), " stack's linears must be quantized");
    TORCH_CHECK(layers_[0].gate_up.weight.dim() == 2, "DecodeStack: gate_up must be 2-D");
    l.qkv.check(H, q + 2 * kv, "qkv");
    l.o.check(q, H, "o");
    l.gate_up.check(H, 2 * intermediate(), "gate_up");
    l.down.check(intermediate(), H, "down");
  }

  void check_ends() const {
    const int64_t H = hidden();
    TORCH_CHECK(ends_.norm.dim() == 1 && ends_.norm.scalar_type() == dtype() &&
                    ends_.norm.is_contiguous() && ends_.norm.numel() == H,
                "DecodeStack: the final norm's weight must be ", dtype(), " [", H, "]");
    const at::Tensor& w = embedding_.weight;
    TORCH_CHECK(w.dim() == 2 && w.is_contiguous() && w.size(0) >= 1,
                "DecodeStack: the embedding must be a contiguous [vocab, ", H, "] weight");
    if (embedding_.qtype == kFloatWeight) {
      TORCH_CHECK(w.scalar_type() == dtype() && w.size(1) == H, "DecodeStack: the embedding ",
                  "must be ", dtype(), " [vocab, ", H, "], got ", w.scalar_type(), " ",
                  w.sizes());
    } else {
      quant_blocks::check_weight(w, embedding_.qtype, H);
    }
    if (!ends_.head) return;
    TORCH_CHECK(dtype() == at::kFloat && ends_.head->qtype != kFloatWeight,
                "DecodeStack: a head in the stack must be quantized, in a float32 stack");
    ends_.head->check(H, ends_.head->weight.size(0), "head");
  }

  void check_step(const at::Tensor& token_ids, const at::Tensor& cos, const at::Tensor& sin,
                  const at::Tensor& slots, const at::Tensor& block_table,
                  const at::Tensor& context_lens, bool by_copy, bool logits) const {
    const int64_t most = by_copy ? kMaxCopyRows : kMaxRows;
    TORCH_CHECK(token_ids.dim() == 1 && token_ids.size(0) >= 1 && token_ids.size(0) <= most,
                "DecodeStack.step: token_ids must be [B] with 1 <= B <= ", most, ", got ",
                token_ids.sizes());
    TORCH_CHECK(!by_copy || takes_copies(),
                "DecodeStack.step: a step by copy needs a float32 stack whose every linear "
                "keeps a bfloat16 copy");
    TORCH_CHECK(!logits || (has_head() && !by_copy),
                "DecodeStack.step: logits come from a stack with a head, on the GEMV");
    const int64_t B = token_ids.size(0), half = dims_.head_dim / 2;
    check_tensor(token_ids, at::kLong, {B}, "token_ids");
    TORCH_CHECK(cos.dim() == 2, "DecodeStack.step: cos must be [positions, ", half, "]");
    check_tensor(cos, at::kFloat, {cos.size(0), half}, "cos");
    check_tensor(sin, at::kFloat, {cos.size(0), half}, "sin");
    check_tensor(slots, at::kLong, {B}, "slots");
    check_tensor(context_lens, at::kLong, {B}, "context_lens");
    TORCH_CHECK(block_table.dim() == 2, "DecodeStack.step: block_table must be [B, blocks]");
    check_tensor(block_table, at::kLong, {B, block_table.size(1)}, "block_table");
    const int64_t vocab = embedding_.weight.size(0);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t id = token_ids.data_ptr<int64_t>()[b];
      TORCH_CHECK(id >= 0 && id < vocab, "DecodeStack.step: token ", id, " is outside the ",
                  "vocabulary of ", vocab);
      const int64_t len = context_lens.data_ptr<int64_t>()[b];
      TORCH_CHECK(len <= cos.size(0), "DecodeStack.step: row ", b, "'s position ", len - 1,
                  " is past the rotary tables' ", cos.size(0));
    }
    check_positions(slots, block_table, context_lens);
  }

  // What burst reads before each step checks its own input: every row's positions, from its
  // context's last to the last step's, lie in its block table (each step checks the blocks).
  void check_burst(const at::Tensor& token_ids, const at::Tensor& block_table,
                   const at::Tensor& context_lens, int64_t steps) const {
    TORCH_CHECK(steps >= 1, "DecodeStack.burst: steps must be at least 1, got ", steps);
    TORCH_CHECK(has_head(), "DecodeStack.burst: a burst samples logits: the stack needs a head");
    TORCH_CHECK(token_ids.dim() == 1, "DecodeStack.burst: token_ids must be [B]");
    const int64_t B = token_ids.size(0);
    check_tensor(token_ids, at::kLong, {B}, "token_ids");
    check_tensor(context_lens, at::kLong, {B}, "context_lens");
    TORCH_CHECK(block_table.dim() == 2, "DecodeStack.burst: block_table must be [B, blocks]");
    check_tensor(block_table, at::kLong, {B, block_table.size(1)}, "block_table");
    const int64_t width = block_table.size(1), block_size = kv_.size(3);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t len = context_lens.data_ptr<int64_t>()[b];
      TORCH_CHECK(len >= 1 && (len + steps - 2) / block_size < width, "DecodeStack.burst: row ",
                  b, "'s positions ", len - 1, " to ", len + steps - 2, " do not fit its ",
                  width, " blocks");
    }
  }

  // Every slot written and every block read lies in the pool: the kernels index it unchecked.
  void check_positions(const at::Tensor& slot_mapping, const at::Tensor& block_table,
                       const at::Tensor& context_lens) const {
    const int64_t blocks = kv_.size(2), block_size = kv_.size(3);
    const int64_t B = slot_mapping.size(0), width = block_table.size(1);
    const int64_t* slots = slot_mapping.data_ptr<int64_t>();
    const int64_t* lens = context_lens.data_ptr<int64_t>();
    const int64_t* table = block_table.data_ptr<int64_t>();
    for (int64_t b = 0; b < B; ++b) {
      TORCH_CHECK(slots[b] >= 0 && slots[b] < blocks * block_size, "DecodeStack.step: slot ",
                  slots[b], " is outside the pool's ", blocks * block_size);
      TORCH_CHECK(lens[b] >= 1 && lens[b] <= width * block_size, "DecodeStack.step: row ", b,
                  "'s context of ", lens[b], " tokens does not fit its ", width, " blocks");
      for (int64_t j = 0; j < (lens[b] + block_size - 1) / block_size; ++j)
        TORCH_CHECK(table[b * width + j] >= 0 && table[b * width + j] < blocks,
                    "DecodeStack.step: block ", table[b * width + j], " is outside the pool's ",
                    blocks);
    }
  }
};

}  // namespace

void register_decode_stack(py::module_& m) {
  py::class_<Linear>(m, "StackLinear")
      .def(py::init([](at::Tensor weight, c10::optional<int64_t> qtype, int64_t bits,
                       c10::optional<at::Tensor> bias, c10::optional<at::Tensor> copy,
                       c10::optional<at::Tensor> copy_bias, bool copy_packed) {
             TORCH_CHECK(bits == 0 || bits == 8 || bits == 16, "bits: 0, 8 or 16, got ", bits);
             TORCH_CHECK(!copy || (copy->scalar_type() == at::kBFloat16 &&
                                   (!copy_bias || copy_bias->scalar_type() == at::kBFloat16)),
                         "StackLinear: a copy and its bias must be bfloat16");
             c10::optional<Copy> kept;
             if (copy) kept = Copy{*copy, copy_bias, copy_packed};
             return Linear{weight, qtype.value_or(kFloatWeight), bits, bias, kept};
           }),
           py::arg("weight"), py::arg("qtype"), py::arg("bits"), py::arg("bias"),
           py::arg("copy") = py::none(), py::arg("copy_bias") = py::none(),
           py::arg("copy_packed") = false);
  py::class_<Layer>(m, "StackLayer")
      .def(py::init([](at::Tensor input_norm, at::Tensor post_norm, Linear qkv, Linear o,
                       Linear gate_up, Linear down) {
             return Layer{input_norm, post_norm, qkv, o, gate_up, down};
           }),
           py::arg("input_norm"), py::arg("post_norm"), py::arg("qkv"), py::arg("o"),
           py::arg("gate_up"), py::arg("down"));
  py::class_<DecodeStack>(m, "DecodeStack")
      .def(py::init([](std::vector<Layer> layers, int64_t heads, int64_t kv_heads,
                       int64_t head_dim, double eps, double scale, at::Tensor kv,
                       at::Tensor embedding, c10::optional<int64_t> embedding_qtype,
                       at::Tensor final_norm, c10::optional<Linear> head) {
             return DecodeStack(std::move(layers), heads, kv_heads, head_dim, eps, scale, kv,
                                Embedding{embedding, embedding_qtype.value_or(kFloatWeight)},
                                Ends{final_norm, head});
           }),
           py::arg("layers"), py::arg("heads"), py::arg("kv_heads"), py::arg("head_dim"),
           py::arg("eps"), py::arg("scale"), py::arg("kv"), py::arg("embedding"),
           py::arg("embedding_qtype"), py::arg("final_norm"), py::arg("head") = py::none())
      .def("step", &DecodeStack::step, py::arg("token_ids"), py::arg("cos"), py::arg("sin"),
           py::arg("slots"), py::arg("block_table"), py::arg("context_lens"),
           py::arg("by_copy") = false, py::arg("logits") = false,
           py::call_guard<py::gil_scoped_release>())
      .def("burst", &DecodeStack::burst, py::arg("token_ids"), py::arg("cos"), py::arg("sin"),
           py::arg("block_table"), py::arg("context_lens"), py::arg("steps"),
           py::arg("stop") = py::none(), py::call_guard<py::gil_scoped_release>())
      .def("takes_copies", &DecodeStack::takes_copies)
      .def("time_parts", &DecodeStack::time_parts, py::arg("on"))
      .def("part_times", &DecodeStack::part_times)
      .def("has_head", &DecodeStack::has_head);
  m.def(
      "use_step_pool", [](bool enabled) { return kernels::step_pool_enabled.exchange(enabled); },
      "whether fused decode steps run their loops on their own pool (else OpenMP); the old value");
}
