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
#include <c10/util/Half.h>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <type_traits>
#include <vector>

namespace {

inline float load(const float* p) { return *p; }
inline float load(const c10::BFloat16* p) { return c10::detail::f32_from_bits(p->x); }
inline float load(const c10::Half* p) { return static_cast<float>(*p); }

// Round a float result to the storage type, as an eager operator producing that type does.
template <typename T>
inline float rounded(float value) {
  return static_cast<float>(static_cast<T>(value));
}

// Call body(scalar) with a value of the tensor dtype's C++ type (the checks admit float32 and bfloat16 only; caches
// may also be float16, see dispatch_with_cache).
template <typename Body>
void dispatch(at::ScalarType dtype, Body body) {
  if (dtype == at::kBFloat16) {
    body(c10::BFloat16());
  } else {
    body(0.0f);
  }
}

// Call body(activation, cache) with values of the C++ types of the activations' dtype and the key/value caches'
// dtype: the same type, or float16 caches for float32 activations (the int8-activation forward's cache, as
// llama.cpp keeps it).
template <typename Body>
void dispatch_with_cache(at::ScalarType dtype, at::ScalarType cache_dtype, Body body) {
  if (cache_dtype == at::kHalf) {
    TORCH_CHECK(dtype == at::kFloat, "float16 caches go with float32 activations");
    body(0.0f, c10::Half());
  } else {
    TORCH_CHECK(cache_dtype == dtype, "the caches must have the activations' dtype, or float16");
    dispatch(dtype, [&](auto tag) { body(tag, tag); });
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
template <typename T, typename C>
void rotary_kv_impl(const T* qkv, const T* cos, const T* sin, C* key_cache, C* value_cache, T* query, int64_t batch,
                    int64_t heads, int64_t kv_heads, int64_t head_dim, CacheStrides strides, int64_t column) {
  const int64_t half = head_dim / 2;
  const int64_t row_width = (heads + 2 * kv_heads) * head_dim;
  auto rotate = [&](const T* in, const T* c, const T* s, auto* out) {
    using Out = std::remove_pointer_t<decltype(out)>;
    for (int64_t d = 0; d < head_dim; ++d) {
      const float partner = d < half ? -load(in + d + half) : load(in + d - half);
      const T rotated = static_cast<T>(rounded<T>(load(in + d) * load(c + d)) + rounded<T>(partner * load(s + d)));
      out[d] = static_cast<Out>(load(&rotated));
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
      for (int64_t d = 0; d < head_dim; ++d) value_cache[slot + d] = static_cast<C>(load(value + d));
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
inline Vec load_vec(const c10::Half* p) {
  Vec out;
  at::vec::load_to_float(p, out);
  return out;
}

// Softmax attention of one new query per head over the first `length` cached positions of its row, skipping
// positions whose mask entry is 0; query heads that share a key/value head are processed together, so each cached
// key and value row is read (and widened to float) once.
template <typename T, typename C>
void decode_attention_impl(const T* query, const C* key_cache, const C* value_cache, const int64_t* mask, T* out,
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
      const C* keys = key_cache + b * strides.batch + g * strides.head;
      const C* values = value_cache + b * strides.batch + g * strides.head;
      const int64_t* visible = mask + b * mask_stride;
      int64_t count = 0;
      for (int64_t j = 0; j < length; ++j) {
        if (visible[j]) positions[count++] = j;
      }
      for (int64_t i = 0; i < group * head_dim; ++i) queries[i] = load(query + (b * heads + g * group) * head_dim + i);
      std::fill(maxima.begin(), maxima.end(), -std::numeric_limits<float>::infinity());
      for (int64_t i = 0; i < count; ++i) {
        const C* key = keys + positions[i] * head_dim;
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
        // The weights enter the product with the values in the activations' type, as in torch's CPU flash attention.
        for (int64_t i = 0; i < count; ++i) weights[i] = rounded<T>(weights[i]);
      }
      std::fill(accumulated.begin(), accumulated.end(), 0.0f);
      for (int64_t i = 0; i < count; ++i) {
        const C* value = values + positions[i] * head_dim;
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
  for (const torch::Tensor* tensor : {&cos, &sin}) {
    TORCH_CHECK(tensor->scalar_type() == qkv.scalar_type(), "qkv, cos and sin must share a dtype");
  }
  TORCH_CHECK(value_cache.scalar_type() == key_cache.scalar_type(), "the key and value caches must share a dtype");
  const int64_t batch = key_cache.size(0), head_dim = key_cache.size(3), capacity = key_cache.size(2);
  TORCH_CHECK(key_cache.size(1) == kv_heads && kv_heads > 0 && heads % kv_heads == 0, "bad head counts");
  TORCH_CHECK(qkv.dim() == 2 && qkv.size(0) == batch && qkv.size(1) == (heads + 2 * kv_heads) * head_dim,
              "qkv must be [batch, (heads + 2 * kv_heads) * head_dim]");
  TORCH_CHECK(cos.numel() == batch * head_dim && sin.numel() == batch * head_dim, "cos/sin must be [batch, head_dim]");
  TORCH_CHECK(head_dim % 2 == 0 && column >= 0 && column < capacity, "column outside the cache");
  auto query = torch::empty({batch, heads, head_dim}, qkv.options());
  dispatch_with_cache(qkv.scalar_type(), key_cache.scalar_type(), [&](auto tag, auto cache_tag) {
    using scalar_t = decltype(tag);
    using cache_t = decltype(cache_tag);
    rotary_kv_impl<scalar_t, cache_t>(qkv.data_ptr<scalar_t>(), cos.data_ptr<scalar_t>(), sin.data_ptr<scalar_t>(),
                                      key_cache.data_ptr<cache_t>(), value_cache.data_ptr<cache_t>(),
                                      query.data_ptr<scalar_t>(), batch, heads, kv_heads, head_dim, strides, column);
  });
  return query;
}

torch::Tensor decode_attention(const torch::Tensor& query, const torch::Tensor& key_cache,
                               const torch::Tensor& value_cache, const torch::Tensor& mask, int64_t length) {
  check_cpu_contiguous(query, "query");
  const CacheStrides strides = cache_strides(key_cache, value_cache);
  TORCH_CHECK(query.dim() == 3, "query must be [batch, heads, head_dim]");
  TORCH_CHECK(value_cache.scalar_type() == key_cache.scalar_type(), "the key and value caches must share a dtype");
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
  dispatch_with_cache(query.scalar_type(), key_cache.scalar_type(), [&](auto tag, auto cache_tag) {
    using scalar_t = decltype(tag);
    using cache_t = decltype(cache_tag);
    decode_attention_impl<scalar_t, cache_t>(query.data_ptr<scalar_t>(), key_cache.data_ptr<cache_t>(),
                                             value_cache.data_ptr<cache_t>(), mask.data_ptr<int64_t>(),
                                             out.data_ptr<scalar_t>(), batch, heads, kv_heads, head_dim, strides,
                                             length, mask.stride(0), 1.0f / std::sqrt(static_cast<float>(head_dim)));
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

// ---------------------------------------------------------------------------------------------------------------
// Block-quantized weights: llama.cpp's GGUF blocks of 32 weights along the input dimension, bytes as in the file.
//   Q4_1 (20 bytes): fp16 d, fp16 m, 16 bytes of 4-bit q (byte j holds q[j] in its low nibble, q[j + 16] in its
//                    high nibble); w = d * q + m
//   Q8_0 (34 bytes): fp16 d, 32 int8 q; w = d * q
// A quantized weight is a uint8 tensor [out_features, in_features / 32 * block bytes]; its kind follows from the
// bytes per block. Products take float32 inputs and accumulate in float32, so they equal the float32 product with
// the dequantized weights up to summation order (d * q is exact in float32): serving a model's GGUF blocks computes
// what the float32 model converted from the same file computes, while reading 3-6x fewer bytes per token.

constexpr int64_t kBlock = 32;
constexpr int64_t kQ4_1Bytes = 20;
constexpr int64_t kQ8_0Bytes = 34;

enum class BlockKind { q4_1, q8_0 };

inline float half_at(const uint8_t* bytes) {
  uint16_t bits;
  std::memcpy(&bits, bytes, sizeof(bits));
#if defined(__F16C__)
  return _cvtsh_ss(bits);
#else
  return c10::detail::fp16_ieee_to_fp32_value(bits);
#endif
}

BlockKind block_kind(const torch::Tensor& weight, int64_t in_features) {
  TORCH_CHECK(weight.scalar_type() == torch::kByte && weight.dim() == 2 && weight.is_contiguous() &&
                  weight.device().is_cpu(),
              "block-quantized weights must be a contiguous CPU uint8 tensor [out_features, bytes]");
  TORCH_CHECK(in_features > 0 && in_features % kBlock == 0,
              "block-quantized weights need in_features a multiple of 32, got ", in_features);
  const int64_t blocks = in_features / kBlock;
  if (weight.size(1) == blocks * kQ4_1Bytes) return BlockKind::q4_1;
  if (weight.size(1) == blocks * kQ8_0Bytes) return BlockKind::q8_0;
  TORCH_CHECK(false, "rows of ", weight.size(1), " bytes are neither Q4_1 nor Q8_0 blocks of ", in_features, " inputs");
  return BlockKind::q8_0;
}

inline int64_t block_bytes(BlockKind kind) { return kind == BlockKind::q4_1 ? kQ4_1Bytes : kQ8_0Bytes; }

// The 32 weights of one block, as numpy computes them when dequantizing a GGUF file (d * q, then + m).
inline void dequantize_block(BlockKind kind, const uint8_t* block, float* out) {
  const float d = half_at(block);
  if (kind == BlockKind::q4_1) {
    const float m = half_at(block + 2);
    const uint8_t* packed = block + 4;
    for (int j = 0; j < 16; ++j) {
      out[j] = d * static_cast<float>(packed[j] & 0x0F) + m;
      out[j + 16] = d * static_cast<float>(packed[j] >> 4) + m;
    }
  } else {
    const int8_t* values = reinterpret_cast<const int8_t*>(block + 2);
    for (int j = 0; j < 32; ++j) out[j] = d * static_cast<float>(values[j]);
  }
}

#if defined(__AVX2__)
// q of one block as four vectors of 8 floats (the caller applies d and m).
inline void block_q_vectors(BlockKind kind, const uint8_t* block, __m256 q[4]) {
  if (kind == BlockKind::q4_1) {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 4));
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m128i low = _mm_and_si128(packed, mask);
    const __m128i high = _mm_and_si128(_mm_srli_epi16(packed, 4), mask);
    q[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(low));
    q[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(low, 8)));
    q[2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(high));
    q[3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(high, 8)));
  } else {
    const __m128i first = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2));
    const __m128i second = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 18));
    q[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(first));
    q[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(first, 8)));
    q[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(second));
    q[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(second, 8)));
  }
}

inline float horizontal_sum(__m256 v) {
  __m128 sum = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  sum = _mm_hadd_ps(sum, sum);
  sum = _mm_hadd_ps(sum, sum);
  return _mm_cvtss_f32(sum);
}
#endif

// out[r * out_stride] = sum over blocks b of d_b * (q_b . x_r[b]) + m_b * sums[r][b], for R input rows: the blocks of
// one weight row are unpacked once for all R rows.
template <int R>
void block_dot_rows(BlockKind kind, const uint8_t* row, int64_t blocks, const float* x, int64_t x_stride,
                    const float* sums, float* out, int64_t out_stride) {
  const int64_t bytes = block_bytes(kind);
#if defined(__AVX2__)
  __m256 acc[R];
  float offset[R];
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm256_setzero_ps();
    offset[r] = 0.0f;
  }
  __m256 q[4];
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block = row + b * bytes;
    block_q_vectors(kind, block, q);
    const __m256 d = _mm256_set1_ps(half_at(block));
    const float m = kind == BlockKind::q4_1 ? half_at(block + 2) : 0.0f;
    for (int r = 0; r < R; ++r) {
      const float* xr = x + r * x_stride + b * kBlock;
      __m256 t = _mm256_mul_ps(q[0], _mm256_loadu_ps(xr));
      t = _mm256_fmadd_ps(q[1], _mm256_loadu_ps(xr + 8), t);
      t = _mm256_fmadd_ps(q[2], _mm256_loadu_ps(xr + 16), t);
      t = _mm256_fmadd_ps(q[3], _mm256_loadu_ps(xr + 24), t);
      acc[r] = _mm256_fmadd_ps(d, t, acc[r]);
      if (kind == BlockKind::q4_1) offset[r] += m * sums[r * blocks + b];
    }
  }
  for (int r = 0; r < R; ++r) out[r * out_stride] = horizontal_sum(acc[r]) + offset[r];
#else
  float weights[kBlock];
  float total[R] = {};
  for (int64_t b = 0; b < blocks; ++b) {
    dequantize_block(kind, row + b * bytes, weights);
    for (int r = 0; r < R; ++r) {
      const float* xr = x + r * x_stride + b * kBlock;
      for (int j = 0; j < kBlock; ++j) total[r] += weights[j] * xr[j];
    }
  }
  for (int r = 0; r < R; ++r) out[r * out_stride] = total[r];
#endif
}

// Inputs quantized to int8 per block of 32 (llama.cpp's Q8_1 activations): q = round(x / s) with s = max|x| / 127,
// so |q| <= 127. The integer products below then need no unpacking to float: Q4_1's unsigned nibbles or Q8_0's
// magnitudes times signed int8 inputs, 32 at a time (maddubs; no int16 overflow since 2 * 127 * 127 < 32768).
void quantize_inputs(const float* x, int64_t count, int8_t* q, float* scales) {
  for (int64_t b = 0; b < count / kBlock; ++b) {
    const float* xb = x + b * kBlock;
    float amax = 0.0f;
    for (int j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float scale = amax / 127.0f;
    const float inverse = scale > 0.0f ? 1.0f / scale : 0.0f;
    for (int j = 0; j < kBlock; ++j) q[b * kBlock + j] = static_cast<int8_t>(std::nearbyint(xb[j] * inverse));
    scales[b] = scale;
  }
}

// Interleaved blocks: the int8-input layout of a block weight. Rows go in groups of 8 and, per group and block of 32
// inputs, the 8 rows' scales d (then, for Q4_1, offsets m) come first as fp16, then their values in 32-byte vectors
// whose 4-byte lane i holds 4 consecutive values of row i. One broadcast of 4 int8 inputs then multiplies 8 rows at
// once (maddubs), the integer sum of a block is exact, and the 8 rows' results come out as one vector: no unpacking
// to float and no horizontal sums. For Q4_1 the 128 bytes after the scales pack 8 such vectors as nibbles: byte k of
// vector p holds value 8p + (k % 4) of its row in the low nibble and value 8p + 4 + (k % 4) in the high one. A group
// takes as many bytes as its 8 rows in GGUF order (160 for Q4_1, 272 for Q8_0).
constexpr int64_t kGroup = 8;

inline int64_t interleaved_scale_bytes(BlockKind kind) { return kind == BlockKind::q4_1 ? 32 : 16; }

// weight [out_features, bytes] in GGUF order -> [out_features / 8, blocks, 8 * block bytes].
torch::Tensor interleave_blocks(const torch::Tensor& weight, int64_t in_features) {
  const BlockKind kind = block_kind(weight, in_features);
  const int64_t rows = weight.size(0), blocks = in_features / kBlock, bytes = block_bytes(kind);
  TORCH_CHECK(rows % kGroup == 0, "interleaving needs out_features a multiple of 8, got ", rows);
  auto out = torch::zeros({rows / kGroup, blocks, kGroup * bytes}, weight.options());
  const uint8_t* source = weight.data_ptr<uint8_t>();
  uint8_t* target = out.data_ptr<uint8_t>();
  const int64_t scale_bytes = interleaved_scale_bytes(kind);
  for (int64_t g = 0; g < rows / kGroup; ++g) {
    for (int64_t b = 0; b < blocks; ++b) {
      uint8_t* group = target + (g * blocks + b) * kGroup * bytes;
      for (int64_t i = 0; i < kGroup; ++i) {
        const uint8_t* block = source + (g * kGroup + i) * weight.size(1) + b * bytes;
        std::memcpy(group + 2 * i, block, 2);  // d
        if (kind == BlockKind::q4_1) std::memcpy(group + 16 + 2 * i, block + 2, 2);  // m
        uint8_t* values = group + scale_bytes;
        for (int64_t j = 0; j < kBlock; ++j) {
          if (kind == BlockKind::q4_1) {
            // value j of the row: GGUF keeps values 0-15 in the low nibbles of bytes 4-19, values 16-31 in the high
            const uint8_t q = j < 16 ? (block[4 + j] & 0x0F) : (block[4 + j - 16] >> 4);
            const int64_t vector = j / 4, byte = (vector / 2) * 32 + i * 4 + j % 4;
            values[byte] |= vector % 2 == 0 ? q : static_cast<uint8_t>(q << 4);
          } else {
            values[(j / 4) * 32 + i * 4 + j % 4] = block[2 + j];
          }
        }
      }
    }
  }
  return out;
}

// out[r * out_stride + i] for the 8 rows i of one group, for R input rows quantized by quantize_inputs:
// sum over blocks b of d_ib * s_rb * (q_ib . qx_rb) (+ m_ib * sums[r][b] for Q4_1).
template <int R>
void interleaved_dot_int8(BlockKind kind, const uint8_t* group, int64_t blocks, const int8_t* x, int64_t x_stride,
                          const float* scales, const float* sums, float* out, int64_t out_stride) {
  const int64_t bytes = kGroup * block_bytes(kind), scale_bytes = interleaved_scale_bytes(kind);
#if defined(__AVX2__)
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i mask = _mm256_set1_epi8(0x0F);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block = group + b * bytes;
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block)));
    const uint8_t* values = block + scale_bytes;
    if (kind == BlockKind::q4_1) {
      const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 16)));
      __m256i q[8];
      for (int p = 0; p < 4; ++p) {
        const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(values + 32 * p));
        q[2 * p] = _mm256_and_si256(packed, mask);
        q[2 * p + 1] = _mm256_and_si256(_mm256_srli_epi16(packed, 4), mask);
      }
      for (int r = 0; r < R; ++r) {
        const int8_t* xr = x + r * x_stride + b * kBlock;
        // 8 pairs of products of at most 15 * 127 per int16 lane: their sum stays below 32768
        __m256i pairs = _mm256_setzero_si256();
        for (int v = 0; v < 8; ++v) {
          int32_t four;
          std::memcpy(&four, xr + 4 * v, sizeof(four));
          pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(q[v], _mm256_set1_epi32(four)));
        }
        const __m256 dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
        acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(scales[r * blocks + b])), dot, acc[r]);
        acc[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(sums[r * blocks + b]), acc[r]);
      }
    } else {
      for (int r = 0; r < R; ++r) {
        const int8_t* xr = x + r * x_stride + b * kBlock;
        __m256i total = _mm256_setzero_si256();
        for (int v = 0; v < 8; ++v) {
          const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(values + 32 * v));
          int32_t four;
          std::memcpy(&four, xr + 4 * v, sizeof(four));
          const __m256i inputs = _mm256_sign_epi8(_mm256_set1_epi32(four), q);
          total = _mm256_add_epi32(total, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(q, q), inputs), ones));
        }
        acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(scales[r * blocks + b])), _mm256_cvtepi32_ps(total),
                                 acc[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(out + r * out_stride, acc[r]);
#else
  float total[R][kGroup] = {};
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block = group + b * bytes;
    const uint8_t* values = block + scale_bytes;
    for (int64_t i = 0; i < kGroup; ++i) {
      int32_t q[kBlock];
      for (int64_t j = 0; j < kBlock; ++j) {
        if (kind == BlockKind::q4_1) {
          const uint8_t packed = values[(j / 8) * 32 + i * 4 + j % 4];
          q[j] = (j / 4) % 2 == 0 ? (packed & 0x0F) : (packed >> 4);
        } else {
          q[j] = static_cast<int8_t>(values[(j / 4) * 32 + i * 4 + j % 4]);
        }
      }
      const float d = half_at(block + 2 * i);
      for (int r = 0; r < R; ++r) {
        const int8_t* xr = x + r * x_stride + b * kBlock;
        int32_t dot = 0;
        for (int64_t j = 0; j < kBlock; ++j) dot += q[j] * xr[j];
        total[r][i] += d * scales[r * blocks + b] * static_cast<float>(dot);
        if (kind == BlockKind::q4_1) total[r][i] += half_at(block + 16 + 2 * i) * sums[r * blocks + b];
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int64_t i = 0; i < kGroup; ++i) out[r * out_stride + i] = total[r][i];
  }
#endif
}

using BlockDot = void (*)(BlockKind, const uint8_t*, int64_t, const float*, int64_t, const float*, float*, int64_t);
constexpr int kMaxTile = 8;
const BlockDot kBlockDots[kMaxTile] = {block_dot_rows<1>, block_dot_rows<2>, block_dot_rows<3>, block_dot_rows<4>,
                                       block_dot_rows<5>, block_dot_rows<6>, block_dot_rows<7>, block_dot_rows<8>};

using InterleavedDot = void (*)(BlockKind, const uint8_t*, int64_t, const int8_t*, int64_t, const float*,
                                const float*, float*, int64_t);
constexpr int kMaxInterleavedTile = 4;  // input rows per pass: 8 weight vectors and 4 accumulators fill the registers
const InterleavedDot kInterleavedDots[kMaxInterleavedTile] = {interleaved_dot_int8<1>, interleaved_dot_int8<2>,
                                                              interleaved_dot_int8<3>, interleaved_dot_int8<4>};

// The block kind of weight: [out_features, bytes] in GGUF order or [out_features / 8, blocks, bytes] interleaved.
BlockKind weight_kind(const torch::Tensor& weight, int64_t in_features) {
  if (weight.dim() != 3) return block_kind(weight, in_features);
  TORCH_CHECK(weight.scalar_type() == torch::kByte && weight.is_contiguous() && weight.device().is_cpu(),
              "interleaved block weights must be a contiguous CPU uint8 tensor [out_features / 8, blocks, bytes]");
  TORCH_CHECK(in_features % kBlock == 0 && weight.size(1) == in_features / kBlock,
              "interleaved block weights hold ", weight.size(1), " blocks per row, the inputs ", in_features);
  if (weight.size(2) == kGroup * kQ4_1Bytes) return BlockKind::q4_1;
  TORCH_CHECK(weight.size(2) == kGroup * kQ8_0Bytes, "interleaved groups of ", weight.size(2),
              " bytes are neither Q4_1 nor Q8_0");
  return BlockKind::q8_0;
}

// inputs [..., in_features] (float32) times a block-quantized weight: [..., out_features]. Weights in GGUF order
// multiply the float32 inputs; interleaved weights (interleave_blocks) multiply the inputs quantized to int8 per
// block of 32 (quantize_inputs), in integers: several times faster, no longer equal to the float32 product (see
// docs/serving.md for the measured effect).
torch::Tensor block_linear(const torch::Tensor& inputs, const torch::Tensor& weight,
                           const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(inputs.scalar_type() == torch::kFloat && inputs.device().is_cpu(), "inputs must be float32 on the CPU");
  const int64_t in_features = inputs.size(-1);
  const BlockKind kind = weight_kind(weight, in_features);
  const bool interleaved = weight.dim() == 3;
  const auto x = inputs.reshape({-1, in_features}).contiguous();
  const int64_t rows = x.size(0), blocks = in_features / kBlock;
  const int64_t out_features = interleaved ? weight.size(0) * kGroup : weight.size(0);
  const float* values = x.data_ptr<float>();
  std::vector<float> sums;  // per row and block: the sum of the inputs, which Q4_1's offsets m multiply
  if (kind == BlockKind::q4_1) {
    sums.resize(rows * blocks);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t b = 0; b < blocks; ++b) {
        const float* xr = values + r * in_features + b * kBlock;
        float total = 0.0f;
        for (int j = 0; j < kBlock; ++j) total += xr[j];
        sums[r * blocks + b] = total;
      }
    }
  }
  std::vector<int8_t> quantized;
  std::vector<float> scales;
  if (interleaved) {
    quantized.resize(rows * in_features);
    scales.resize(rows * blocks);
    for (int64_t r = 0; r < rows; ++r) {
      quantize_inputs(values + r * in_features, in_features, quantized.data() + r * in_features,
                      scales.data() + r * blocks);
    }
  }
  auto out = torch::empty({rows, out_features}, x.options());
  float* result = out.data_ptr<float>();
  const uint8_t* packed = weight.data_ptr<uint8_t>();
  // Output features in chunks whose weights stay in cache while every tile of input rows passes over them.
  constexpr int64_t chunk = 32;
  const int64_t chunks = (out_features + chunk - 1) / chunk;
  if (interleaved) {
    const int64_t group_bytes = blocks * weight.size(2);
    at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        const int64_t first = c * chunk / kGroup, last = std::min(weight.size(0), (c + 1) * chunk / kGroup);
        for (int64_t r0 = 0; r0 < rows; r0 += kMaxInterleavedTile) {
          const int64_t tile = std::min<int64_t>(kMaxInterleavedTile, rows - r0);
          for (int64_t g = first; g < last; ++g) {
            kInterleavedDots[tile - 1](kind, packed + g * group_bytes, blocks, quantized.data() + r0 * in_features,
                                       in_features, scales.data() + r0 * blocks,
                                       sums.empty() ? nullptr : sums.data() + r0 * blocks,
                                       result + r0 * out_features + g * kGroup, out_features);
          }
        }
      }
    });
  } else {
    const int64_t row_bytes = weight.size(1);
    at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        const int64_t first = c * chunk, last = std::min(out_features, first + chunk);
        for (int64_t r0 = 0; r0 < rows; r0 += kMaxTile) {
          const int64_t tile = std::min<int64_t>(kMaxTile, rows - r0);
          const float* tile_sums = sums.empty() ? nullptr : sums.data() + r0 * blocks;
          for (int64_t n = first; n < last; ++n) {
            kBlockDots[tile - 1](kind, packed + n * row_bytes, blocks, values + r0 * in_features, in_features,
                                 tile_sums, result + r0 * out_features + n, out_features);
          }
        }
      }
    });
  }
  if (bias) out.add_(bias->to(torch::kFloat));
  auto shape = inputs.sizes().vec();
  shape.back() = out_features;
  return out.view(shape);
}

// The float32 weights [out_features, in_features] a block-quantized weight stands for.
torch::Tensor dequantize_blocks(const torch::Tensor& weight, int64_t in_features) {
  const BlockKind kind = block_kind(weight, in_features);
  const int64_t rows = weight.size(0), blocks = in_features / kBlock, bytes = block_bytes(kind);
  auto out = torch::empty({rows, in_features}, torch::dtype(torch::kFloat));
  const uint8_t* packed = weight.data_ptr<uint8_t>();
  float* result = out.data_ptr<float>();
  at::parallel_for(0, rows, 64, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      for (int64_t b = 0; b < blocks; ++b) {
        dequantize_block(kind, packed + n * weight.size(1) + b * bytes, result + n * in_features + b * kBlock);
      }
    }
  });
  return out;
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

// The matrix product of the fast forward: block_linear on block-quantized weights (int8 inputs when interleaved),
// oneDNN's on weights reordered by mkldnn::_reorder_linear_weight (packed), else at::linear.
torch::Tensor project(const torch::Tensor& inputs, const torch::Tensor& weight,
                      const c10::optional<torch::Tensor>& bias, bool packed) {
  if (weight.scalar_type() == torch::kByte) return block_linear(inputs, weight, bias);
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
// LoRA) or holds one entry per layer. Interleaved layer weights take int8-quantized inputs (block_linear); the
// output projection keeps float32 ones.
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
    auto query = rotary_kv(with_lora(normed, project(normed, qkv, qkv_bias, packed), qkv_a, qkv_b),
                           cos, sin, key_caches[index], value_caches[index], column, heads, kv_heads);
    auto attended = decode_attention(query, key_caches[index], value_caches[index], mask, column + 1);
    const auto output = with_lora(attended, project(attended, o, o_bias, packed), o_a, o_b);
    std::tie(normed, hidden) = add_rms_norm(hidden, output, norm_mlp, eps);
    auto projected =
        with_lora(normed, project(normed, gate_up, gate_up_bias, packed), gate_up_a, gate_up_b);
    TORCH_CHECK(projected.size(1) == 2 * intermediate, "gate/up projection width disagrees with the config");
    auto activated = at::silu(projected.narrow(1, 0, intermediate));
    activated.mul_(projected.narrow(1, intermediate, intermediate));
    residual = with_lora(activated, project(activated, down, down_bias, packed), down_a, down_b);
  }
  const auto normed = std::get<0>(add_rms_norm(hidden, residual, final_norm, eps));
  // The output projection runs in the head's dtype (float32: logits rounded once, in float32; block-quantized heads
  // take float32 inputs, next to int8 layers too: the head reads its bytes at memory speed either way).
  const auto head_dtype = head.scalar_type() == torch::kByte ? torch::kFloat : head.scalar_type();
  return project(normed.to(head_dtype), head, c10::nullopt, head_packed);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("add_rms_norm", &add_rms_norm, "(hidden + residual, weight * rms_norm(hidden + residual))");
  module.def("rotary_kv", &rotary_kv, "Rotate q and k, write k and v into the cache column, return q");
  module.def("decode_attention", &decode_attention, "Attention of one new token per row over the cache");
  module.def("sample_tokens", &sample_tokens, "Greedy or inverse-CDF sampling of one token per row");
  module.def("vector_width", [] { return Vec::size(); }, "Floats per SIMD vector (head_dim must be a multiple)");
  module.def("block_linear", &block_linear,
             "float32 inputs times Q4_1 / Q8_0 block weights (their int8 blocks times interleaved weights)",
             pybind11::arg("inputs"), pybind11::arg("weight"), pybind11::arg("bias"));
  module.def("interleave_blocks", &interleave_blocks, "Q4_1 / Q8_0 block rows in groups of 8, for int8 inputs");
  module.def("dequantize_blocks", &dequantize_blocks, "The float32 weights of Q4_1 / Q8_0 blocks");
  module.def("decode_step", &decode_step, "All layers, final norm and output projection of one decoding step");
}
