// The C ABI between the kernels and the torch binding of `module_moe_mxfp4_aux`.
//
// Instance translation units include no torch header, so each compiles in about a
// second.  Every instance exports one function with the uniform signature
// `AiterAuxFn`; the generated lookup maps an instance key (e.g. "moe_sort_e257_k9")
// and its compile-time parameter values to it.  On the CPU the kernels are generic (the
// shape read from these structs at run time), compiled once per module; a CPU instance
// calls its op's kernel through `aiter_aux_cpu_kernel`.  The one translation unit that
// includes torch's stable-ABI headers is the binding (binding/torch_binding.h,
// rendered by templates/binding.j2): it validates the torch ops' arguments, fills
// these structs and calls the instance.  Every consumer of the structs is compiled
// into the same module from this one header, so there is no second definition to
// keep in sync; the op table (codegen/ops.py) names the struct of each op and how
// the binding fills it.
#pragma once

#include <stdint.h>

#define AITER_AUX_ABI_VERSION 9

#ifdef __cplusplus
extern "C" {
#endif

// The op kind of an instance (AiterAuxInstance.op) is its op's op_id in the op table
// (codegen/ops.py); the generated lookup and binding carry it.

// Return codes of an instance function.
enum AiterAuxStatus {
  AITER_AUX_OK = 0,
  AITER_AUX_ERR_INVALID_ARGUMENT = 1,  // run-time args disagree with the instance
  AITER_AUX_ERR_LAUNCH = 2,            // GPU launch failed (see aiter_aux_last_error)
};

// moe_sort.  All pointers are device pointers of the module's backend.
// Compile-time parameters of the instance: num_experts, topk.
typedef struct AiterAuxSortArgs {
  const int32_t* topk_ids;    // [num_tokens, topk]
  const float* topk_weights;  // [num_tokens, topk]
  int64_t num_tokens;         // M, < AITER_AUX_MAX_NUM_TOKENS (aiter_aux_limits.h)
  int32_t num_experts;        // must equal the instance's
  int32_t topk;               // must equal the instance's
  int32_t block_m;            // AITER_AUX_VALID_BLOCK_M
  int32_t reserved0;
  int64_t max_rows;            // capacity of the sorted buffers, multiple of block_m
  int32_t* sorted_token_ids;   // [max_rows]  t | (k << 24); pad = M
  float* sorted_weights;       // [max_rows]  pad 0.0
  int32_t* m_indices;          // [max_rows]  t; pad = M
  int32_t* sorted_expert_ids;  // [max_rows / block_m]
  int32_t* num_valid_ids;      // [2] = {rows including padding, M}
  int32_t* reverse_sorted;     // [num_tokens * topk]  row of (t, k), -1 if not local
  uint16_t* zero_buf;          // optional bf16 buffer zeroed in the same call (NULL: none)
  int64_t zero_numel;          // elements of zero_buf
  // Expert parallelism: topk_ids hold global ids; the local expert of id g is
  // expert_map[g] for g in [0, num_global_experts); a pair is local when it is in
  // [0, num_experts).  NULL: topk_ids hold local ids.
  const int32_t* expert_map;  // [num_global_experts] or NULL
  int64_t num_global_experts;
  const uint16_t* zero_init;  // optional bf16 [zero_numel] copied into zero_buf instead of zeros
} AiterAuxSortArgs;

// mxfp4_quant and mxfp8_quant (per_1x32).  Compile-time parameter: model_dim.
typedef struct AiterAuxQuantArgs {
  const uint16_t* x;  // bf16 bits [num_tokens, model_dim], row-major
  int64_t num_tokens;
  int32_t model_dim;  // must equal the instance's
  int32_t reserved0;
  uint8_t* a_q;      // mxfp4: [num_tokens, model_dim / 2]  e2m1, element 2j in the
                     //   low nibble; mxfp8: [num_tokens, model_dim] E4M3 bytes
  uint8_t* a_scale;  // [num_tokens, model_dim / 32] e8m0
} AiterAuxQuantArgs;

// moe_sort_quant / moe_sort_quant_fp8: both in one call.  Compile-time: num_experts, topk,
// model_dim.
typedef struct AiterAuxSortQuantArgs {
  AiterAuxSortArgs sort;
  AiterAuxQuantArgs quant;
  // Optional (NULL: none): the decode pipeline's third output, written by the same call as
  // moe_sort_scales would write it from this call's a_scale, sorted_token_ids and
  // num_valid_ids: uint8 [ceil(max_rows / BM) * BM, model_dim / 32], BM = max(32, block_m);
  // needs model_dim % 256 == 0.
  uint8_t* sorted_scales;
} AiterAuxSortQuantArgs;

// moe_sort_scales.  Compile-time parameter: model_dim.
typedef struct AiterAuxSortScalesArgs {
  const uint8_t* a_scale;  // [num_tokens, model_dim / 32] e8m0, row-major
  int64_t num_tokens;
  int32_t model_dim;                // must equal the instance's; multiple of 256
  int32_t block_m;                  // 16, 32, 64 or 128 (BM = max(32, block_m))
  const int32_t* sorted_token_ids;  // [max_rows]
  const int32_t* num_valid_ids;     // [2]
  int64_t max_rows;                 // length of sorted_token_ids
  uint8_t* sorted_scales;           // [ceil(max_rows / BM) * BM, model_dim / 32] bytes
} AiterAuxSortScalesArgs;

// The moe_sort_scales args of a fused call's sorted_scales: this call's a_scale (its M rows),
// sorted_token_ids (its max_rows) and num_valid_ids (every backend's one definition).
static inline AiterAuxSortScalesArgs aiter_aux_sort_scales_args(const AiterAuxSortQuantArgs* a) {
  AiterAuxSortScalesArgs s;
  s.a_scale = a->quant.a_scale;
  s.num_tokens = a->quant.num_tokens;
  s.model_dim = a->quant.model_dim;
  s.block_m = a->sort.block_m;
  s.sorted_token_ids = a->sort.sorted_token_ids;
  s.num_valid_ids = a->sort.num_valid_ids;
  s.max_rows = a->sort.max_rows;
  s.sorted_scales = a->sorted_scales;
  return s;
}

// moe_scatter_reduce (bf16 expert_out) and moe_scatter_reduce_q (MXFP4 expert_out).
// Compile-time parameters: model_dim, topk.
typedef struct AiterAuxScatterArgs {
  const uint16_t* expert_out;       // bf16 [num_rows, model_dim]        (scatter_reduce)
  const uint8_t* expert_out_q;      // e2m1 [num_rows, model_dim / 2]    (scatter_reduce_q)
  const uint8_t* expert_out_scale;  // e8m0 [num_rows, model_dim / 32]   (scatter_reduce_q)
  int64_t num_rows;                 // rows of expert_out
  const int32_t* reverse_sorted;    // [num_tokens * topk]
  const float* sorted_weights;      // [num_rows] (at least)
  int64_t num_tokens;
  int32_t model_dim;            // must equal the instance's
  int32_t topk;                 // must equal the instance's
  uint16_t* out;                // bf16 [num_tokens, model_dim]
  float routed_scaling_factor;  // out = bf16_rne(fp32 sum * factor); 1.0: plain sum
  int32_t reserved1;
} AiterAuxScatterArgs;

// moe_align_block_size_vllm / moe_align_block_size_sglang: the sort in vLLM's or SGLang's
// output format (docs/compat.md).  Compile-time parameter: num_experts.  The pairs are the
// flat indices i of topk_ids (its topk does not matter to these ops).
typedef struct AiterAuxAlignArgs {
  const int32_t* topk_ids;       // [numel]
  int64_t numel;                 // pairs, < AITER_AUX_MAX_NUM_TOKENS
  int32_t num_experts;           // must equal the instance's (SGLang: without its -1 bucket)
  int32_t block_size;            // [1, AITER_AUX_MAX_ALIGN_BLOCK_SIZE]
  int64_t capacity;              // elements of sorted_token_ids (>= the op's capacity rule)
  int32_t* sorted_token_ids;     // [capacity]  i; padding and rows past the total = numel
  int32_t* expert_ids;           // [ceil(capacity / block_size)]  -1 past the used blocks
  int32_t* num_tokens_post_pad;  // [1]  rows used (a multiple of block_size)
  int32_t* scatter_idx;          // [numel]  i for a pair that takes part, else -1
  // vLLM with ignore_invalid_experts: the pair's expert is expert_map[id] (ids in
  // [0, num_global_experts)); NULL: the id.
  const int32_t* expert_map;
  int64_t num_global_experts;
  // vLLM with expert_map, without ignore_invalid_experts: block labels, expert_ids[b] =
  // block_expert_map[e], and block_expert_map[block_map_numel - 1] past the used blocks.
  const int32_t* block_expert_map;
  int64_t block_map_numel;
} AiterAuxAlignArgs;
// The peers' sorted_token_ids capacities (aiter_aux.reference.compat, docs/compat.md).
static inline int64_t aiter_aux_vllm_align_capacity(int64_t numel, int64_t num_experts,
                                                    int64_t block_size) {
  const int64_t cap = numel + num_experts * (block_size - 1);
  return numel < num_experts && numel * block_size < cap ? numel * block_size : cap;
}
static inline int64_t aiter_aux_sglang_align_capacity(int64_t numel, int64_t num_experts,
                                                      int64_t block_size) {
  return numel < num_experts + 1 ? numel * block_size
                                 : numel + (num_experts + 1) * (block_size - 1);
}
// The dtype of a moe_sum's input and output (AiterAuxSumArgs.dtype).
enum AiterAuxDType {
  AITER_AUX_DTYPE_F32 = 0,
  AITER_AUX_DTYPE_F16 = 1,
  AITER_AUX_DTYPE_BF16 = 2,
};

typedef struct AiterAuxSumArgs {
  const void* input;  // [num_tokens, topk, model_dim] of `dtype`, row-major
  int64_t num_tokens;
  int64_t model_dim;
  int64_t topk;                 // >= 1
  int32_t dtype;                // AiterAuxDType of input and output
  float routed_scaling_factor;  // out = round(fp32 sum * factor); 1.0: plain sum
  // Optional (NULL: every slot is summed): slot (t, k) is skipped when topk_ids[t, k] < 0,
  // or with expert_map when the id is >= num_global_experts or expert_map[id] < 0.
  const int32_t* topk_ids;    // [num_tokens, topk] or NULL
  const int32_t* expert_map;  // [num_global_experts] or NULL
  int64_t num_global_experts;
  void* output;  // [num_tokens, model_dim] of `dtype`
} AiterAuxSumArgs;

// moe_route (docs/ops.md "moe_route"; aiter_aux/reference/route.py the spec).
enum AiterAuxScoring {
  AITER_AUX_SCORING_SOFTMAX = 0,
  AITER_AUX_SCORING_SIGMOID = 1,
  AITER_AUX_SCORING_NONE = 2,  // the logits are the scores (widened to fp32)
};

typedef struct AiterAuxRouteArgs {
  const void* router_logits;  // [num_tokens, num_experts] of `dtype`, row-major
  int64_t num_tokens;
  int64_t num_experts;            // E, 1..AITER_AUX_MAX_ROUTE_EXPERTS
  int64_t topk;                   // 1..min(E, AITER_AUX_MAX_ROUTE_TOPK)
  int32_t dtype;                  // AiterAuxDType of router_logits
  int32_t scoring;                // AiterAuxScoring
  int32_t renormalize;            // 1: weights divided by their fp32 sum
  int32_t num_expert_group;       // G (divides E), 0: no groups
  int32_t topk_group;             // groups kept (1..G), 0 without groups
  float routed_scaling_factor;    // every weight times this
  const float* correction_bias;   // [num_experts] or NULL
  float* topk_weights;            // [num_tokens, topk]
  int32_t* topk_ids;              // [num_tokens, topk]
  int32_t* token_expert_indices;  // [num_tokens, topk] or NULL: k * num_tokens + t
} AiterAuxRouteArgs;

// moe_route_sort_quant / moe_route_sort_quant_fp8: moe_route, then moe_sort_quant[_fp8] of its
// outputs (sort_quant.sort's topk_ids and topk_weights are route's).  Compile-time: those of
// moe_sort_quant.
typedef struct AiterAuxRouteSortQuantArgs {
  AiterAuxRouteArgs route;
  AiterAuxSortQuantArgs sort_quant;
} AiterAuxRouteSortQuantArgs;

// The capacity of the sorted buffers, max_rows = round_up(M*topk + E*(block_m - 1), block_m)
// (docs/ops.md): the one C/C++ definition (the GPU kernels and the binding use it; Python's
// is aiter_aux.validation.ints.sort_capacity).
static inline int64_t aiter_aux_sort_capacity(int64_t num_tokens, int64_t topk, int64_t num_experts,
                                              int64_t block_m) {
  return (num_tokens * topk + num_experts * (block_m - 1) + block_m - 1) / block_m * block_m;
}

// Every instance function: `args` points to the struct of its op kind;
// `stream` is the backend's stream (cudaStream_t / hipStream_t), NULL on CPU.
typedef int (*AiterAuxFn)(const void* args, void* stream);

#define AITER_AUX_MAX_PARAMS 3  // compile-time parameters of any op (codegen MAX_PARAMS)

typedef struct AiterAuxInstance {
  const char* key;                       // e.g. "moe_sort_e257_k9"
  int32_t op;                            // op_id of the op table
  int32_t params[AITER_AUX_MAX_PARAMS];  // compile-time values, template order (rest 0)
  AiterAuxFn fn;
} AiterAuxInstance;

// Exported by the generated lookup translation unit.
int aiter_aux_abi_version(void);
const char* aiter_aux_backend(void);  // "cpu", "cuda" or "rocm"
int aiter_aux_num_instances(void);
const AiterAuxInstance* aiter_aux_instance(int index);
const char* aiter_aux_instance_key(int index);  // key of instance `index` (NULL if out of range)
const AiterAuxInstance* aiter_aux_find(const char* key);  // NULL if absent
const char* aiter_aux_last_error(void);                   // message of the last failing call
int64_t aiter_aux_kernel_calls(void);  // instance calls so far (tests: "no kernel ran")
void aiter_aux_count_kernel_call(void);
// Programmatic dependent launch (PDL): 1 launches every later kernel with the
// programmatic-stream-serialization attribute, 0 (the initial value) plain launches.  The
// switch is read at each launch; it takes effect only in CUDA builds whose every target is
// sm_90 or newer (gpu/hip_compat.h); on HIP and the CPU it changes nothing.
void aiter_aux_set_pdl(int on);
int aiter_aux_pdl(void);  // the switch's value (0 or 1)

// Instances loaded on demand (module_common.cpp).  The binding looks an instance up in the
// module's own table (the lookup TU: the prebuilt set), then among the registered ones; on a
// miss it calls the resolver, which may build and register the instance, then looks again.
#define AITER_AUX_MAX_REGISTERED 4096
// Adds an instance (the key is copied); 0 on success, -1 when the table is full.
int aiter_aux_register_instance(const char* key, int32_t op, const int32_t* params, AiterAuxFn fn);
const AiterAuxInstance* aiter_aux_find_registered(int32_t op, const int32_t* params,
                                                  int32_t num_params);  // NULL if absent
int aiter_aux_num_registered(void);
// Makes the instance of `op` for `params` available (registers it) and returns 0, or returns
// non-zero with "<ErrorType>: <message>" in `error` (or an empty `error`: none available).
typedef int (*AiterAuxResolver)(int32_t op, const int32_t* params, int32_t num_params, char* error,
                                int32_t error_size);
void aiter_aux_set_resolver(AiterAuxResolver resolver);  // NULL: none
AiterAuxResolver aiter_aux_resolver(void);
// What an instance library (instance_lib.cpp) is linked to when it is loaded: the module's
// error setter, PDL flag (a std::atomic<int>*) and, from a CPU module, its
// aiter_aux_cpu_kernel (NULL from a GPU module):
//   void aiter_aux_link_module(void (*set_error)(const char*), void* pdl_flag,
//                              AiterAuxFn (*cpu_kernel)(int32_t op));
void* aiter_aux_pdl_flag(void);
// The CPU backend's generic kernel of op `op` (its op_id), which serves every key of the op;
// exported by the lookup TU of a CPU module, and by an instance library linked to one.
AiterAuxFn aiter_aux_cpu_kernel(int32_t op);

#ifdef __cplusplus
}  // extern "C"
#endif
