// The ADInplaceOrView kernel of every aiter_aux op that writes tensors (Tensor(a!) in its
// schema: the _out buffers, zero_buf, sorted_scales).  It does for them what torch's own
// out= and in-place ops do: under grad mode a written tensor that requires grad is refused
// before anything runs, and after the op each written tensor's version is bumped, so autograd
// refuses a backward over values the op overwrote ("modified by an inplace operation").
//
// Built apart from the kernel modules (aiter_aux/jit/written_versions.py): it uses torch's full
// C++ API, whose ABI is that of one torch build, where the modules keep to the stable ABI.
// The refusal's text is aiter_aux.ops._library.grad_error's (a test checks they agree).
// Loading it registers the kernel for every aiter_aux op defined at that moment that writes.
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <memory>
#include <string>
#include <vector>

namespace {

void bump_written(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                  torch::jit::Stack* stack) {
  const auto& args = op.schema().arguments();
  const size_t first = stack->size() - args.size();
  c10::SmallVector<at::Tensor, 8> written;
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::AliasInfo* alias = args[i].alias_info();
    const c10::IValue& value = (*stack)[first + i];
    if (alias != nullptr && alias->isWrite() && value.isTensor())
      written.push_back(value.toTensor());
  }
  if (c10::GradMode::is_enabled()) {
    for (const at::Tensor& t : written) {
      TORCH_CHECK(!t.requires_grad(), op.schema().operator_name().name.substr(11),
                  "(): functions with out=... arguments don't support automatic differentiation, "
                  "but one of the arguments requires grad (the aux ops are not differentiable)");
    }
  }
  {
    at::AutoDispatchBelowADInplaceOrView below;
    op.redispatchBoxed(keys & c10::after_ADInplaceOrView_keyset, stack);
  }
  for (const at::Tensor& t : written) {
    if (!t.is_inference()) t.unsafeGetTensorImpl()->bump_version();
  }
}

bool writes(const c10::FunctionSchema& schema) {
  for (const c10::Argument& a : schema.arguments()) {
    if (a.alias_info() != nullptr && a.alias_info()->isWrite()) return true;
  }
  return false;
}

// Registers at load for every aiter_aux op that writes; kept for the life of the process.
struct Register {
  std::unique_ptr<torch::Library> lib;
  Register() {
    lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aiter_aux",
                                           c10::DispatchKey::ADInplaceOrView, __FILE__, __LINE__);
    for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
      if (name.name.rfind("aiter_aux::", 0) != 0) continue;
      auto op = c10::Dispatcher::singleton().findOp(name);
      if (!name.overload_name.empty() || !op || !op->hasSchema() || !writes(op->schema())) continue;
      lib->impl(name.name.substr(11).c_str(),
                torch::CppFunction::makeFromBoxedFunction<&bump_written>());
    }
  }
};
Register registered;

}  // namespace

extern "C" int aiter_aux_written_versions() {
  return 1;
}
