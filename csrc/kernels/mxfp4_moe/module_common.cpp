// The backend-independent part of module_moe_mxfp4_aux: ABI version, struct sizes and
// the per-thread error message.  Compiled once per build directory (no torch header).
#include <stdio.h>
#include <string.h>

#include "mxfp4_moe_aux_abi.h"

namespace {
thread_local char g_last_error[512] = "";
}

extern "C" void aiter_aux_set_error(const char* msg) {
  snprintf(g_last_error, sizeof(g_last_error), "%s", msg ? msg : "");
}

extern "C" const char* aiter_aux_last_error(void) { return g_last_error; }

extern "C" int aiter_aux_abi_version(void) { return AITER_AUX_ABI_VERSION; }

extern "C" int64_t aiter_aux_struct_size(int op) {
  switch (op) {
    case AITER_AUX_OP_MOE_SORT: return sizeof(AiterAuxSortArgs);
    case AITER_AUX_OP_MXFP4_QUANT: return sizeof(AiterAuxQuantArgs);
    case AITER_AUX_OP_MOE_SORT_QUANT: return sizeof(AiterAuxSortQuantArgs);
    case AITER_AUX_OP_MOE_SORT_SCALES: return sizeof(AiterAuxSortScalesArgs);
    case AITER_AUX_OP_MOE_SCATTER_REDUCE:
    case AITER_AUX_OP_MOE_SCATTER_REDUCE_Q: return sizeof(AiterAuxScatterArgs);
    default: return -1;
  }
}
