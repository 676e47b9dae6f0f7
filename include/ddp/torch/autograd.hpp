#pragma once
// What ddp::torch asks of libtorch beyond its stable C++ API, in one place: libtorch 1.13
// (Debian's libtorch-dev) and 2.x keep both, but they live in torch::autograd::impl and
// c10::TensorImpl, which is where a new release would move them.
//
//   after_gradient_accumulated(p, f)  f() runs each time autograd has accumulated p's gradient
//                                     (a post hook on p's AccumulateGrad node, as PyTorch's own
//                                     reducer registers; not a tensor hook, which fires before
//                                     accumulation)
//   bump_version(t)                   t's version counter goes up, as an in-place op would do,
//                                     so autograd sees a write ddp made through raw memory
//   point_storage(t, at)              t's storage object now holds the memory at `at` (not
//                                     owned; nullptr: none): the same storage object, so the views
//                                     autograd saved of t in a forward (a weight's transpose) read
//                                     what is there when backward runs, as FSDP frees and refills a
//                                     parameter's storage in place; own_storage(t, from) gives
//                                     it memory of its own again
#include <torch/torch.h>

#include <cstddef>
#include <cstring>
#include <functional>
#include <memory>
#include <utility>

namespace ddp::torch::detail {

class post_accumulate_hook final : public ::torch::autograd::FunctionPostHook {
 public:
  explicit post_accumulate_hook(std::function<void()> f) : f_(std::move(f)) {}
  ::torch::autograd::variable_list operator()(const ::torch::autograd::variable_list& outputs,
                                              const ::torch::autograd::variable_list&) override {
    f_();
    return outputs;
  }

 private:
  std::function<void()> f_;
};

// Returns the accumulator node: the caller keeps it alive (the tensor holds it only weakly).
inline std::shared_ptr<::torch::autograd::Node> after_gradient_accumulated(const ::torch::Tensor& parameter,
                                                                          std::function<void()> f) {
  auto accumulator = ::torch::autograd::impl::grad_accumulator(parameter);
  accumulator->add_post_hook(std::make_unique<post_accumulate_hook>(std::move(f)));
  return accumulator;
}

inline void bump_version(const ::torch::Tensor& t) { t.unsafeGetTensorImpl()->bump_version(); }

// Where t's elements are now (nullptr: nowhere); unlike data_ptr(), which refuses a storage
// without memory.
inline float* storage_floats(const ::torch::Tensor& t) {
  auto* base = static_cast<float*>(t.storage().data());
  return base ? base + t.storage_offset() : nullptr;
}

inline void point_storage(const ::torch::Tensor& t, float* at) {
  t.storage().set_data_ptr_noswap(c10::DataPtr(at, t.device()));
}

// t's storage object holds memory of its own again, with what `from` holds (zeros: nullptr).
inline void own_storage(const ::torch::Tensor& t, const float* from) {
  const std::size_t bytes = t.storage().nbytes();
  auto owned = c10::GetAllocator(c10::DeviceType::CPU)->allocate(bytes);
  if (from) std::memcpy(owned.get(), from, bytes);
  else std::memset(owned.get(), 0, bytes);
  t.storage().set_data_ptr_noswap(std::move(owned));
}

}  // namespace ddp::torch::detail
