#pragma once
// The module concept: what a user's model provides so the trainer can run it data-parallel.
//
//   using input_type = ...;  using output_type = ...;
//   range of ddp::parameter_ref  parameters();   // stable order and storage after construction
//   range of ddp::buffer_ref     buffers();
//   output_type forward(const input_type&);      // in training, pushes what backward needs
//   void backward(const output_type& grad_output, const ddp::ready_sink& ready);
//        // pops the innermost forward; ACCUMULATES (+=) into every parameter's grad;
//        // may call ready(i) once parameter i's gradient for this backward is final
//
// Optional, each opted into by the module:
//   static constexpr bool reports_gradient_ready = true;
//        // backward calls ready(i) for every parameter that received a gradient; lets buckets
//        // reduce while backward runs. Required by every unused-parameter policy but
//        // unused_params::unchecked (the default, forbid, included): without it an unused
//        // parameter cannot be told apart.
//   void bind_gradient(std::size_t i, float* storage);
//        // from now on parameter i's gradient lives at storage (numel floats, the current
//        // gradient copied there); the trainer points gradients into bucket memory so nothing
//        // is copied before a reduction.
//   void bind_parameter(std::size_t i, float* storage);
//        // the same for parameter i's value; under update::sharded the trainer gathers the
//        // updated parameters there, so nothing is copied after the gather.
//   Both: storage == nullptr gives the module its own storage back (the contents copied
//   there, zeros where the gradient was placed nowhere); a trainer does that when it is
//   destroyed, before its buckets go.
//   void set_layer_hooks(ddp::layer_hooks* hooks);  void place_gradient(std::size_t i, float* storage);
//        // the module calls hooks->before_backward(first, count) before a layer's backward
//        // writes the gradients of parameters [first, first + count) (ddp/core/layer_hooks.hpp;
//        // nullptr: no hooks); place_gradient points parameter i's gradient at storage as it is
//        // there, copying nothing (nullptr: nowhere, and the module's own gradient memory goes;
//        // the trainer places it again before a backward writes it). update::sharded_gradients
//        // needs both: a layer's full gradients then live only from its backward until their
//        // bucket's reduce_scatter completes.
//   void place_parameter(std::size_t i, float* storage);
//        // points parameter i's value at storage as it is there, copying nothing (nullptr:
//        // nowhere, and the module's own value memory goes). update::fully_sharded needs it, with
//        // the layer hooks above called around every layer's forward and backward (before_forward,
//        // after_forward, before_backward, after_backward) and bind_parameter: a layer's
//        // parameters then live only while a forward or backward of it runs.
//   void eval();  void train(bool on = true);  bool training() const;
//        // evaluation mode: forward saves nothing for a backward and layers such as batch_norm
//        // use their running statistics; trainer.evaluate() switches to it and back.
//   void defer_buffer_updates(bool on);  std::size_t buffer_update_size();
//   std::vector<float> take_buffer_updates();  void apply_buffer_updates(std::span<const float>);
//        // while on, each training forward records its buffer update (buffer_update_size()
//        // floats: batch_norm's batch mean and variance) instead of applying it; take returns
//        // the records since the last take, apply applies records in the order given. Under
//        // reduction::invariant the trainer applies every virtual shard's record in shard order on
//        // every rank, so the buffers do not depend on the world size; a module with buffers that
//        // change in training and without this fails such a step, naming the buffer.
//   void set_random_stream(std::uint64_t stream);
//        // the training forwards that follow draw their random numbers (dropout masks) from
//        // `stream`; under reduction::invariant the trainer sets it before each virtual shard's
//        // micro-batch to (step * V + shard), so a shard draws the same on whichever rank runs it.
//
// Example: ddp::nn::sequential (include/ddp/nn/sequential.hpp) models this concept.
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <ranges>
#include <span>
#include <type_traits>
#include <vector>

#include "ddp/core/buffer_version.hpp"
#include "ddp/core/layer_hooks.hpp"
#include "ddp/core/ready_sink.hpp"
#include "ddp/core/tensor.hpp"

namespace ddp {

namespace module_requirements {

template <class M>
concept has_input_type = requires { typename M::input_type; };
template <class M>
concept has_output_type = requires { typename M::output_type; };
template <class M>
concept has_parameters = requires(M& m) {
  { m.parameters() } -> std::ranges::input_range;
  requires std::convertible_to<std::ranges::range_reference_t<decltype(m.parameters())>,
                               parameter_ref>;
};
template <class M>
concept has_buffers = requires(M& m) {
  { m.buffers() } -> std::ranges::input_range;
  requires std::convertible_to<std::ranges::range_reference_t<decltype(m.buffers())>,
                               buffer_ref>;
};
template <class M>
concept has_forward = has_input_type<M> && has_output_type<M> &&
                      requires(M& m, const typename M::input_type& x) {
                        { m.forward(x) } -> std::convertible_to<typename M::output_type>;
                      };
template <class M>
concept has_backward = has_output_type<M> &&
                       requires(M& m, const typename M::output_type& g, const ready_sink& s) {
                         m.backward(g, s);
                       };

}  // namespace module_requirements

template <class M>
concept trainable_module =
    module_requirements::has_input_type<M> && module_requirements::has_output_type<M> &&
    module_requirements::has_parameters<M> && module_requirements::has_buffers<M> &&
    module_requirements::has_forward<M> && module_requirements::has_backward<M>;

// A constant: a non-static or non-constexpr member of that name reports nothing (the trainer's
// static_assert then names `static constexpr bool reports_gradient_ready = true;`).
template <class M>
concept reports_gradient_ready =
    requires { typename std::bool_constant<static_cast<bool>(M::reports_gradient_ready)>; } &&
    static_cast<bool>(M::reports_gradient_ready);

template <class M>
concept binds_gradient_storage = requires(M& m, std::size_t i, float* p) { m.bind_gradient(i, p); };

template <class M>
concept binds_parameter_storage = requires(M& m, std::size_t i, float* p) { m.bind_parameter(i, p); };

template <class M>
concept places_gradients = requires(M& m, layer_hooks* h, std::size_t i, float* p) {
  m.set_layer_hooks(h);
  m.place_gradient(i, p);
};

template <class M>
concept places_parameters = places_gradients<M> && requires(M& m, std::size_t i, float* p) { m.place_parameter(i, p); };

template <class M>
concept keys_random_streams = requires(M& m, std::uint64_t stream) { m.set_random_stream(stream); };

template <class M>
concept defers_buffer_updates = requires(M& m, bool on, std::span<const float> records) {
  m.defer_buffer_updates(on);
  { m.buffer_update_size() } -> std::convertible_to<std::size_t>;
  { m.take_buffer_updates() } -> std::convertible_to<std::vector<float>>;
  m.apply_buffer_updates(records);
};

template <class M>
consteval bool diagnose_module() {
  namespace r = module_requirements;
  static_assert(r::has_input_type<M>, "ddp: the module lacks `using input_type = ...;`");
  static_assert(r::has_output_type<M>, "ddp: the module lacks `using output_type = ...;`");
  static_assert(r::has_parameters<M>,
                "ddp: the module lacks `parameters()` returning a range of ddp::parameter_ref");
  static_assert(r::has_buffers<M>,
                "ddp: the module lacks `buffers()` returning a range of ddp::buffer_ref (an "
                "empty range when it has none)");
  static_assert(r::has_forward<M>,
                "ddp: the module lacks `output_type forward(const input_type&)`");
  static_assert(r::has_backward<M>,
                "ddp: the module lacks `backward(const output_type& grad_output, const "
                "ddp::ready_sink&)`");
  return trainable_module<M>;
}

}  // namespace ddp
