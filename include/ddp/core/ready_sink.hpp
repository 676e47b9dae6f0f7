#pragma once
// What a module's backward tells when a parameter's gradient is final for this backward:
// sink(i) with i the parameter's position in parameters(). The trainer starts reducing a
// bucket as soon as every parameter in it has been reported, while backward goes on.
// A default-constructed sink ignores every report (backward outside a trainer).
#include <cstddef>
#include <memory>
#include <type_traits>

namespace ddp {

class ready_sink {
 public:
  ready_sink() = default;

  template <class F>
    requires(!std::is_same_v<std::remove_cvref_t<F>, ready_sink> &&
             std::is_invocable_v<F&, std::size_t>)
  explicit ready_sink(F& f) noexcept
      : context_(std::addressof(f)),
        call_([](void* c, std::size_t i) { (*static_cast<F*>(c))(i); }) {}

  void operator()(std::size_t parameter_index) const {
    if (call_) call_(context_, parameter_index);
  }

 private:
  void* context_ = nullptr;
  void (*call_)(void*, std::size_t) = nullptr;
};

}  // namespace ddp
