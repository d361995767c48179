// Fused CPU kernels for one decoding step (one new token per row) of a Llama-architecture model.
//
// A decoding step at batch 8 spends about as long in the small per-layer operators (norms, rotary embedding,
// attention over the cache) and in calling them from Python as in reading the weights. decode_step runs all layers
// in one call: RMSNorm with the residual add, rotary embedding with the cache write, and attention are one pass
// each; the matrix products and the activation are the same ATen/oneDNN calls as the Python path. Results round
// where the eager PyTorch operators round (every bfloat16 operator result; attention like torch's CPU flash
// attention), and the build disables floating-point contraction, so outputs match the Python path up to float32
// summation order.
//
// Built at run time by agentbolt.serving.decode_kernels (torch.utils.cpp_extension) with -O3 -march=native.

// ATen's portable SIMD vectors (at::vec::Vectorized) use the widest instruction set this compilation may use.
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
#define CPU_CAPABILITY AVX512
#define CPU_CAPABILITY_AVX512
#elif defined(__AVX2__) && defined(__FMA__)
#define CPU_CAPABILITY AVX2
#define CPU_CAPABILITY_AVX2
#endif

#include <torch/extension.h>

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

namespace {

inline float load(const float* p) { return *p; }
inline float load(const c10::BFloat16* p) { return c10::detail::f32_from_bits(p->x); }

// Round a float result to the storage type, as an eager operator producing that type does.
template <typename T>
inline float rounded(float value) {
  return static_cast<float>(static_cast<T>(value));
}

// Call body(scalar) with a value of the tensor dtype's C++ type (the checks admit float32 and bfloat16 only).
template <typename Body>
void dispatch(at::ScalarType dtype, Body body) {
  if (dtype == at::kBFloat16) {
    body(c10::BFloat16());
  } else {
    body(0.0f);
  }
}

// Element strides of a [batch, kv_heads, capacity, head_dim] cache buffer whose positions are contiguous rows
// (a buffer whose leading columns were dropped is a view with the strides of the larger buffer).
struct CacheStrides {
  int64_t batch;
  int64_t head;
};

CacheStrides cache_strides(const torch::Tensor& key_cache, const torch::Tensor& value_cache) {
  TORCH_CHECK(key_cache.dim() == 4 && key_cache.sizes() == value_cache.sizes(),
              "caches must be [batch, kv_heads, capacity, head_dim] of one shape");
  TORCH_CHECK(key_cache.strides() == value_cache.strides(), "key and value caches must share strides");
  TORCH_CHECK(key_cache.stride(3) == 1 && key_cache.stride(2) == key_cache.size(3),
              "cache positions must be contiguous rows of head_dim values");
  TORCH_CHECK(key_cache.device().is_cpu() && value_cache.device().is_cpu(), "caches must be CPU tensors");
  return {key_cache.stride(0), key_cache.stride(1)};
}

void check_cpu_contiguous(const torch::Tensor& tensor, const char* name) {
  TORCH_CHECK(tensor.device().is_cpu(), name, " must be a CPU tensor");
  TORCH_CHECK(tensor.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK(tensor.scalar_type() == torch::kFloat || tensor.scalar_type() == torch::kBFloat16, name,
              " must be float32 or bfloat16, got ", tensor.scalar_type());
}

// hidden (+ residual), then weight * rms_norm(hidden in float32) rounded to the storage type.
template <typename T>
void add_rms_norm_impl(const T* hidden, const T* residual, const T* weight, T* normed, T* summed, int64_t rows,
                       int64_t width, float eps) {
  std::vector<float> row_values(width);
  for (int64_t row = 0; row < rows; ++row) {
    const T* in = hidden + row * width;
    const T* add = residual ? residual + row * width : nullptr;
    T* sum_out = summed ? summed + row * width : nullptr;
    float squares = 0.0f;
    for (int64_t i = 0; i < width; ++i) {
      float value = load(in + i);
      if (add) value = rounded<T>(value + load(add + i));
      row_values[i] = value;
      squares += value * value;
    }
    const float inverse = 1.0f / std::sqrt(squares / static_cast<float>(width) + eps);
    T* out = normed + row * width;
    for (int64_t i = 0; i < width; ++i) {
      if (sum_out) sum_out[i] = static_cast<T>(row_values[i]);
      out[i] = static_cast<T>(load(weight + i) * rounded<T>(row_values[i] * inverse));
    }
  }
}

// Rotate the query and key heads of a fused q/k/v projection (rotate-half convention), write keys and values into
// the cache at `column` and return the rotated queries [batch, heads, head_dim].
template <typename T>
void rotary_kv_impl(const T* qkv, const T* cos, const T* sin, T* key_cache, T* value_cache, T* query, int64_t batch,
                    int64_t heads, int64_t kv_heads, int64_t head_dim, CacheStrides strides, int64_t column) {
  const int64_t half = head_dim / 2;
  const int64_t row_width = (heads + 2 * kv_heads) * head_dim;
  auto rotate = [&](const T* in, const T* c, const T* s, T* out) {
    for (int64_t d = 0; d < head_dim; ++d) {
      const float partner = d < half ? -load(in + d + half) : load(in + d - half);
      out[d] = static_cast<T>(rounded<T>(load(in + d) * load(c + d)) + rounded<T>(partner * load(s + d)));
    }
  };
  for (int64_t b = 0; b < batch; ++b) {
    const T* row = qkv + b * row_width;
    const T* c = cos + b * head_dim;
    const T* s = sin + b * head_dim;
    for (int64_t h = 0; h < heads; ++h) rotate(row + h * head_dim, c, s, query + (b * heads + h) * head_dim);
    for (int64_t g = 0; g < kv_heads; ++g) {
      const int64_t slot = b * strides.batch + g * strides.head + column * head_dim;
      rotate(row + (heads + g) * head_dim, c, s, key_cache + slot);
      const T* value = row + (heads + kv_heads + g) * head_dim;
      for (int64_t d = 0; d < head_dim; ++d) value_cache[slot + d] = value[d];
    }
  }
}

using Vec = at::vec::Vectorized<float>;

inline Vec load_vec(const float* p) { return Vec::loadu(p); }
inline Vec load_vec(const c10::BFloat16* p) {
  Vec out;
  at::vec::load_to_float(p, out);
  return out;
}

// Softmax attention of one new query per head over the first `length` cached positions of its row, skipping
// positions whose mask entry is 0; query heads that share a key/value head are processed together, so each cached
// key and value row is read (and widened to float) once.
template <typename T>
void decode_attention_impl(const T* query, const T* key_cache, const T* value_cache, const int64_t* mask, T* out,
                           int64_t batch, int64_t heads, int64_t kv_heads, int64_t head_dim, CacheStrides strides,
                           int64_t length, int64_t mask_stride, float scale) {
  const int64_t group = heads / kv_heads;
  const int64_t chunks = head_dim / Vec::size();
  at::parallel_for(0, batch * kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> queries(group * head_dim), accumulated(group * head_dim), scores(group * length);
    std::vector<float> totals(group), maxima(group);
    std::vector<int64_t> positions(length);
    std::vector<Vec> row(chunks);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / kv_heads;
      const int64_t g = item % kv_heads;
      const T* keys = key_cache + b * strides.batch + g * strides.head;
      const T* values = value_cache + b * strides.batch + g * strides.head;
      const int64_t* visible = mask + b * mask_stride;
      int64_t count = 0;
      for (int64_t j = 0; j < length; ++j) {
        if (visible[j]) positions[count++] = j;
      }
      for (int64_t i = 0; i < group * head_dim; ++i) queries[i] = load(query + (b * heads + g * group) * head_dim + i);
      std::fill(maxima.begin(), maxima.end(), -std::numeric_limits<float>::infinity());
      for (int64_t i = 0; i < count; ++i) {
        const T* key = keys + positions[i] * head_dim;
        for (int64_t c = 0; c < chunks; ++c) row[c] = load_vec(key + c * Vec::size());
        for (int64_t h = 0; h < group; ++h) {
          const float* q = queries.data() + h * head_dim;
          Vec dot(0.0f);
          for (int64_t c = 0; c < chunks; ++c) dot = at::vec::fmadd(Vec::loadu(q + c * Vec::size()), row[c], dot);
          const float score = at::vec::vec_reduce_all([](Vec x, Vec y) { return x + y; }, dot) * scale;
          scores[h * length + i] = score;
          maxima[h] = std::max(maxima[h], score);
        }
      }
      for (int64_t h = 0; h < group; ++h) {
        float* weights = scores.data() + h * length;
        const Vec top(maxima[h]);
        Vec total(0.0f);
        for (int64_t i = 0; i < count; i += Vec::size()) {
          const int64_t filled = std::min<int64_t>(Vec::size(), count - i);
          const Vec weight = Vec::set(Vec(0.0f), (Vec::loadu(weights + i, filled) - top).exp_u20(), filled);
          total += weight;
          weight.store(weights + i, filled);
        }
        totals[h] = at::vec::vec_reduce_all([](Vec x, Vec y) { return x + y; }, total);
        // The weights enter the product with the values in the storage type, as in torch's CPU flash attention.
        for (int64_t i = 0; i < count; ++i) weights[i] = rounded<T>(weights[i]);
      }
      std::fill(accumulated.begin(), accumulated.end(), 0.0f);
      for (int64_t i = 0; i < count; ++i) {
        const T* value = values + positions[i] * head_dim;
        for (int64_t c = 0; c < chunks; ++c) row[c] = load_vec(value + c * Vec::size());
        for (int64_t h = 0; h < group; ++h) {
          const Vec weight(scores[h * length + i]);
          float* acc = accumulated.data() + h * head_dim;
          for (int64_t c = 0; c < chunks; ++c) {
            at::vec::fmadd(weight, row[c], Vec::loadu(acc + c * Vec::size())).store(acc + c * Vec::size());
          }
        }
      }
      for (int64_t h = 0; h < group; ++h) {
        T* o = out + (b * heads + g * group + h) * head_dim;
        const float inverse = totals[h] > 0.0f ? 1.0f / totals[h] : 0.0f;  // a row that sees nothing gets zeros
        for (int64_t d = 0; d < head_dim; ++d) o[d] = static_cast<T>(accumulated[h * head_dim + d] * inverse);
      }
    }
  });
}

std::tuple<torch::Tensor, torch::Tensor> add_rms_norm(const torch::Tensor& hidden,
                                                      const c10::optional<torch::Tensor>& residual,
                                                      const torch::Tensor& weight, double eps) {
  check_cpu_contiguous(hidden, "hidden");
  check_cpu_contiguous(weight, "weight");
  TORCH_CHECK(hidden.dim() == 2, "hidden must be [rows, width]");
  TORCH_CHECK(weight.numel() == hidden.size(1) && weight.scalar_type() == hidden.scalar_type(),
              "weight must match hidden's width and dtype");
  if (residual) {
    check_cpu_contiguous(*residual, "residual");
    TORCH_CHECK(residual->sizes() == hidden.sizes() && residual->scalar_type() == hidden.scalar_type(),
                "residual must match hidden");
  }
  auto normed = torch::empty_like(hidden);
  auto summed = residual ? torch::empty_like(hidden) : hidden;
  dispatch(hidden.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    add_rms_norm_impl<scalar_t>(hidden.data_ptr<scalar_t>(), residual ? residual->data_ptr<scalar_t>() : nullptr,
                                weight.data_ptr<scalar_t>(), normed.data_ptr<scalar_t>(),
                                residual ? summed.data_ptr<scalar_t>() : nullptr, hidden.size(0), hidden.size(1),
                                static_cast<float>(eps));
  });
  return {normed, summed};
}

torch::Tensor rotary_kv(const torch::Tensor& qkv, const torch::Tensor& cos, const torch::Tensor& sin,
                        const torch::Tensor& key_cache, const torch::Tensor& value_cache, int64_t column,
                        int64_t heads, int64_t kv_heads) {
  check_cpu_contiguous(qkv, "qkv");
  check_cpu_contiguous(cos, "cos");
  check_cpu_contiguous(sin, "sin");
  const CacheStrides strides = cache_strides(key_cache, value_cache);
  for (const torch::Tensor* tensor : {&cos, &sin, &key_cache, &value_cache}) {
    TORCH_CHECK(tensor->scalar_type() == qkv.scalar_type(), "qkv, cos, sin and the caches must share a dtype");
  }
  const int64_t batch = key_cache.size(0), head_dim = key_cache.size(3), capacity = key_cache.size(2);
  TORCH_CHECK(key_cache.size(1) == kv_heads && kv_heads > 0 && heads % kv_heads == 0, "bad head counts");
  TORCH_CHECK(qkv.dim() == 2 && qkv.size(0) == batch && qkv.size(1) == (heads + 2 * kv_heads) * head_dim,
              "qkv must be [batch, (heads + 2 * kv_heads) * head_dim]");
  TORCH_CHECK(cos.numel() == batch * head_dim && sin.numel() == batch * head_dim, "cos/sin must be [batch, head_dim]");
  TORCH_CHECK(head_dim % 2 == 0 && column >= 0 && column < capacity, "column outside the cache");
  auto query = torch::empty({batch, heads, head_dim}, qkv.options());
  dispatch(qkv.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    rotary_kv_impl<scalar_t>(qkv.data_ptr<scalar_t>(), cos.data_ptr<scalar_t>(), sin.data_ptr<scalar_t>(),
                             key_cache.data_ptr<scalar_t>(), value_cache.data_ptr<scalar_t>(),
                             query.data_ptr<scalar_t>(), batch, heads, kv_heads, head_dim, strides, column);
  });
  return query;
}

torch::Tensor decode_attention(const torch::Tensor& query, const torch::Tensor& key_cache,
                               const torch::Tensor& value_cache, const torch::Tensor& mask, int64_t length) {
  check_cpu_contiguous(query, "query");
  const CacheStrides strides = cache_strides(key_cache, value_cache);
  TORCH_CHECK(query.dim() == 3, "query must be [batch, heads, head_dim]");
  TORCH_CHECK(key_cache.scalar_type() == query.scalar_type() && value_cache.scalar_type() == query.scalar_type(),
              "query and caches must share a dtype");
  const int64_t batch = query.size(0), heads = query.size(1), head_dim = query.size(2);
  const int64_t kv_heads = key_cache.size(1), capacity = key_cache.size(2);
  TORCH_CHECK(key_cache.size(0) == batch && key_cache.size(3) == head_dim && heads % kv_heads == 0,
              "query and caches disagree");
  TORCH_CHECK(length > 0 && length <= capacity, "length outside the cache");
  TORCH_CHECK(head_dim % Vec::size() == 0, "head_dim must be a multiple of ", Vec::size());
  TORCH_CHECK(mask.device().is_cpu() && mask.scalar_type() == torch::kLong && mask.dim() == 2 &&
                  mask.size(0) == batch && mask.size(1) >= length && mask.stride(1) == 1,
              "mask must be int64 [batch, >= length] with contiguous rows");
  auto out = torch::empty({batch, heads * head_dim}, query.options());
  dispatch(query.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    decode_attention_impl<scalar_t>(query.data_ptr<scalar_t>(), key_cache.data_ptr<scalar_t>(),
                                    value_cache.data_ptr<scalar_t>(), mask.data_ptr<int64_t>(),
                                    out.data_ptr<scalar_t>(), batch, heads, kv_heads, head_dim, strides, length,
                                    mask.stride(0), 1.0f / std::sqrt(static_cast<float>(head_dim)));
  });
  return out;
}

// Next token of every row: the first maximum where the temperature is 0, else a draw from softmax(logits / T)
// by inverting its cumulative distribution at uniforms[row] (in [0, 1)), like the engine's Python sampler:
// the first token whose cumulative weight exceeds uniforms[row] times the total. Weights are summed per block of
// 256 tokens (vectorized), the block holding the target is found from the block sums and scanned token by token.
torch::Tensor sample_tokens(const torch::Tensor& logits, const torch::Tensor& temperatures,
                            const torch::Tensor& uniforms) {
  check_cpu_contiguous(logits, "logits");
  TORCH_CHECK(logits.scalar_type() == torch::kFloat && logits.dim() == 2 && logits.size(1) > 0,
              "logits must be float32 [rows, vocabulary]");
  const int64_t rows = logits.size(0), vocabulary = logits.size(1);
  for (const torch::Tensor* tensor : {&temperatures, &uniforms}) {
    TORCH_CHECK(tensor->scalar_type() == torch::kFloat && tensor->is_contiguous() && tensor->numel() == rows &&
                    tensor->device().is_cpu(),
                "temperatures and uniforms must be float32 [rows]");
  }
  constexpr int64_t block = 256;
  const int64_t blocks = (vocabulary + block - 1) / block;
  auto tokens = torch::empty({rows}, logits.options().dtype(torch::kLong));
  const float* values = logits.data_ptr<float>();
  const float* temperature = temperatures.data_ptr<float>();
  const float* uniform = uniforms.data_ptr<float>();
  int64_t* chosen = tokens.data_ptr<int64_t>();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> sums(blocks), weights(block);
    for (int64_t row = begin; row < end; ++row) {
      const float* x = values + row * vocabulary;
      const float maximum =
          at::vec::reduce_all<float>([](Vec a, Vec b) { return at::vec::maximum(a, b); }, x, vocabulary);
      if (temperature[row] <= 0.0f) {
        chosen[row] = std::find(x, x + vocabulary, maximum) - x;
        continue;
      }
      const Vec top(maximum), divisor(temperature[row]);
      // exp((x - max) / T) of one block into `weights`; returns how many tokens the block has.
      auto block_weights = [&](int64_t index) {
        const int64_t start = index * block, count = std::min(block, vocabulary - start);
        for (int64_t i = 0; i < count; i += Vec::size()) {
          const int64_t filled = std::min<int64_t>(Vec::size(), count - i);
          ((Vec::loadu(x + start + i, filled) - top) / divisor).exp_u20().store(weights.data() + i, filled);
        }
        return count;
      };
      float total = 0.0f;
      for (int64_t index = 0; index < blocks; ++index) {
        const int64_t count = block_weights(index);
        Vec partial(0.0f);
        for (int64_t i = 0; i < count; i += Vec::size()) {
          const int64_t filled = std::min<int64_t>(Vec::size(), count - i);
          partial += Vec::set(Vec(0.0f), Vec::loadu(weights.data() + i, filled), filled);
        }
        sums[index] = at::vec::vec_reduce_all([](Vec a, Vec b) { return a + b; }, partial);
        total += sums[index];
      }
      const float target = uniform[row] * total;
      float reached = 0.0f;
      int64_t index = 0;
      while (index + 1 < blocks && reached + sums[index] <= target) reached += sums[index++];
      const int64_t count = block_weights(index);
      int64_t pick = -1;
      for (int64_t i = 0; i < count; ++i) {
        if (weights[i] > 0.0f) pick = i;  // rounding can leave the target past the block's last likely token
        reached += weights[i];
        if (reached > target && weights[i] > 0.0f) break;
      }
      chosen[row] = index * block + pick;
    }
  });
  return tokens;
}

// One layer's weights as the fast forward keeps them (fused projections, optional biases).
using LayerWeights = std::tuple<torch::Tensor, torch::Tensor, c10::optional<torch::Tensor>, torch::Tensor,
                                c10::optional<torch::Tensor>, torch::Tensor, torch::Tensor,
                                c10::optional<torch::Tensor>, torch::Tensor, c10::optional<torch::Tensor>>;

// One layer's LoRA factors (a, b) for the fused q/k/v, o, gate/up and down projections; absent where unadapted.
using AdapterWeights =
    std::tuple<c10::optional<torch::Tensor>, c10::optional<torch::Tensor>, c10::optional<torch::Tensor>,
               c10::optional<torch::Tensor>, c10::optional<torch::Tensor>, c10::optional<torch::Tensor>,
               c10::optional<torch::Tensor>, c10::optional<torch::Tensor>>;

// The matrix product of the fast forward: oneDNN's on weights reordered by mkldnn::_reorder_linear_weight
// (packed), else at::linear.
torch::Tensor project(const torch::Tensor& inputs, const torch::Tensor& weight,
                      const c10::optional<torch::Tensor>& bias, bool packed) {
  if (!packed) return at::linear(inputs, weight, bias);
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
                             .typed<torch::Tensor(const torch::Tensor&, const torch::Tensor&,
                                                  const c10::optional<torch::Tensor>&, c10::string_view,
                                                  c10::List<c10::optional<c10::Scalar>>,
                                                  c10::optional<c10::string_view>)>();
  return op.call(inputs, weight, bias, "none", c10::List<c10::optional<c10::Scalar>>(), "");
}

// `projected` plus an adapter's LoRA term b @ (a @ inputs), rounded like PEFT's LoRA layers: the term in the
// factors' dtype, the sum in the wider of the two dtypes, one cast back to the projection's dtype.
torch::Tensor with_lora(const torch::Tensor& inputs, const torch::Tensor& projected,
                        const c10::optional<torch::Tensor>& a, const c10::optional<torch::Tensor>& b) {
  if (!a.has_value()) return projected;
  TORCH_CHECK(b.has_value(), "LoRA factors come in (a, b) pairs");
  const auto term = at::linear(at::linear(inputs.to(a->scalar_type()), *a), *b);
  return at::add(projected, term).to(projected.scalar_type());
}

// Every layer of one decoding step plus the final norm and the output projection: returns the logits
// [batch, vocab] in the head's dtype. `hidden` holds the new tokens' embeddings [batch, hidden]; each layer's
// key/value buffers have room at `column`, where this step's keys and values are written. `adapters` is empty (no
// LoRA) or holds one entry per layer.
torch::Tensor decode_step(torch::Tensor hidden, const torch::Tensor& cos, const torch::Tensor& sin,
                          const torch::Tensor& mask, int64_t column, const std::vector<LayerWeights>& layers,
                          const std::vector<AdapterWeights>& adapters, const std::vector<torch::Tensor>& key_caches,
                          const std::vector<torch::Tensor>& value_caches, const torch::Tensor& final_norm,
                          const torch::Tensor& head, int64_t heads, int64_t kv_heads, int64_t intermediate,
                          double eps, bool packed, bool head_packed) {
  TORCH_CHECK(key_caches.size() == layers.size() && value_caches.size() == layers.size(),
              "one key and one value cache per layer");
  TORCH_CHECK(adapters.empty() || adapters.size() == layers.size(), "no adapter, or one adapter entry per layer");
  const AdapterWeights no_adapter;
  c10::optional<torch::Tensor> residual;
  for (size_t index = 0; index < layers.size(); ++index) {
    const auto& [norm_attention, qkv, qkv_bias, o, o_bias, norm_mlp, gate_up, gate_up_bias, down, down_bias] =
        layers[index];
    const auto& [qkv_a, qkv_b, o_a, o_b, gate_up_a, gate_up_b, down_a, down_b] =
        adapters.empty() ? no_adapter : adapters[index];
    auto [normed, summed] = add_rms_norm(hidden, residual, norm_attention, eps);
    hidden = summed;
    auto query = rotary_kv(with_lora(normed, project(normed, qkv, qkv_bias, packed), qkv_a, qkv_b), cos, sin,
                           key_caches[index], value_caches[index], column, heads, kv_heads);
    auto attended = decode_attention(query, key_caches[index], value_caches[index], mask, column + 1);
    std::tie(normed, hidden) =
        add_rms_norm(hidden, with_lora(attended, project(attended, o, o_bias, packed), o_a, o_b), norm_mlp, eps);
    auto projected = with_lora(normed, project(normed, gate_up, gate_up_bias, packed), gate_up_a, gate_up_b);
    TORCH_CHECK(projected.size(1) == 2 * intermediate, "gate/up projection width disagrees with the config");
    auto activated = at::silu(projected.narrow(1, 0, intermediate));
    activated.mul_(projected.narrow(1, intermediate, intermediate));
    residual = with_lora(activated, project(activated, down, down_bias, packed), down_a, down_b);
  }
  const auto normed = std::get<0>(add_rms_norm(hidden, residual, final_norm, eps));
  // The output projection runs in the head's dtype (float32: logits rounded once, in float32).
  return project(normed.to(head.scalar_type()), head, c10::nullopt, head_packed);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("add_rms_norm", &add_rms_norm, "(hidden + residual, weight * rms_norm(hidden + residual))");
  module.def("rotary_kv", &rotary_kv, "Rotate q and k, write k and v into the cache column, return q");
  module.def("decode_attention", &decode_attention, "Attention of one new token per row over the cache");
  module.def("sample_tokens", &sample_tokens, "Greedy or inverse-CDF sampling of one token per row");
  module.def("vector_width", [] { return Vec::size(); }, "Floats per SIMD vector (head_dim must be a multiple)");
  module.def("decode_step", &decode_step, "All layers, final norm and output projection of one decoding step");
}
