#pragma once
// CommHook: what travels between the ranks when a bucket's gradients are reduced (PyTorch DDP's
// communication hook, chosen at compile time).
//
//   none   (default) the update policy's own collective on the f32 gradients: the bits of a
//          trainer without the slot.
//   fp16   each rank's gradients are divided by the world size and cast to IEEE half, the ranks
//   bf16   sum them in 16 bits (half the bytes of f32), and each casts the sum back to f32. The
//          division comes first, so no sum leaves the range its inputs average to. Error per
//          element: see docs/policies.md ("CommHook").
//   one_of<H...>  one of the hooks H, chosen at run time (select(name)).
//   powersgd<R>   low-rank compression with error feedback: ddp/policy/powersgd.hpp.
//   int8_rows     8 bits per element with an f32 scale per row, all-gathered: ddp/policy/int8_rows.hpp.
//
// A policy of this slot is a type with
//   using slot = ddp::comm_hook::slot;  static constexpr std::string_view name;
//   void reduce(ddp::comm_hook::bucket_io&);  // the bucket's gradients are ready: start
//   void finish(ddp::comm_hook::bucket_io&);  // the optimizer is about to read them: complete
// When finish returns, gradients()[shard_begin(), shard_begin() + shard()) must hold the
// average over the ranks. Every rank calls both for every bucket, in bucket order, so a hook
// that issues the same collectives on every rank cannot deadlock; the trainer reduces its own
// control floats (micro-batch count, unused-parameter flags) in f32 beside the hook's traffic.
// A hook that needs the device itself (its kernels, matrix products) makes reduce and finish
// templates over the bucket_io they are given: the trainer gives a bucket_io_on<Device>.
// A hook that does the same device work and collectives every step, and reads nothing on the
// host, may declare `static constexpr bool capturable = true;`: a step captured into a CUDA graph
// (ddp::cuda::step_graph) may then hold it. A hook that leaves the gradients to the trainer's own
// collective (it calls bucket_io::reduce_gradients(), which also carries the control floats:
// the bits of none) may declare `static constexpr bool plain = true;`: it is then accepted where
// none is (under reduction::invariant) and goes unnamed where the trainer describes itself, as
// none does. A hook that declares plain and reduces the last bucket otherwise is an error.
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <string>
#include <string_view>

#include "ddp/core/buffer.hpp"
#include "ddp/core/dtype.hpp"
#include "ddp/core/reduce_op.hpp"
#include "ddp/policy/one_of.hpp"
#include "ddp/policy/slots.hpp"

namespace ddp::policy::comm_hook {

struct slot;

// One parameter's gradient inside a bucket: `rows * cols` floats from `offset`, row-major, its
// shape's first dimension by the rest (a vector is rows x 1), as PyTorch's PowerSGD views it.
struct tensor_layout {
  std::size_t offset = 0;
  std::size_t rows = 0;
  std::size_t cols = 0;
};

// A hook's state for one bucket: device memory kept from step to step and saved in checkpoints.
// `fresh` when this call made it (zeroed), rather than an earlier step or a loaded checkpoint.
struct hook_state {
  void* data = nullptr;
  bool fresh = false;
};

// One bucket as a hook sees it, offered by the trainer. Pointers are device memory; device work
// and collectives are queued in call order.
class bucket_io {
 public:
  // The bucket's index (0 is reduced first) and the number of optimizer steps taken before this one.
  virtual std::size_t index() const noexcept = 0;
  virtual std::uint64_t step() const noexcept = 0;
  virtual int rank() const noexcept = 0;
  virtual int ranks() const noexcept = 0;
  // This rank's gradients: size() floats, zero padding included.
  virtual float* gradients() noexcept = 0;
  virtual std::size_t size() const noexcept = 0;
  // The part that must hold the average when finish returns: all of it under
  // update::replicated, this rank's shard under update::sharded.
  virtual std::size_t shard_begin() const noexcept = 0;
  virtual std::size_t shard() const noexcept = 0;
  // The parameters in the bucket, in bucket order (padding after the last).
  virtual std::span<const tensor_layout> tensors() const noexcept = 0;
  // Device memory kept with this bucket for the hook from step to step, zeroed when first made
  // or when its size changes; `slot` tells several apart. A new size frees the old memory: never
  // between starting a collective on it and wait().
  virtual void* scratch(int slot, std::size_t bytes) = 0;
  // Like scratch, but part of the run: trainer.save writes it and trainer.load restores it (at
  // the world size it was saved with; at another, it starts fresh). A new size starts it fresh.
  virtual hook_state state(int slot, std::size_t bytes) = 0;
  // to = from * factor: f32 -> f16 / bf16 (factor rounded in f32 first), or f16 / bf16 -> f32 with factor 1.
  virtual void cast(const_buffer from, mutable_buffer to, float factor) = 0;

  // The update policy's own collective, started on the f32 gradients (what `none` does).
  virtual void reduce_gradients() = 0;
  // The update policy's collective on `buffer`, laid out as the gradients (size() elements, any
  // dtype): afterwards its [shard_begin(), shard_begin() + shard()) holds the reduction over ranks.
  virtual void reduce_like_gradients(mutable_buffer buffer, reduce_op) = 0;
  // Collectives of the hook's own (PowerSGD's low-rank factors; int8_rows's quantized rows):
  // all_gather puts every rank's `send` into `recv` in rank order (recv: ranks() times send's count).
  virtual void all_reduce(const_buffer send, mutable_buffer recv, reduce_op) = 0;
  virtual void all_gather(const_buffer send, mutable_buffer recv) = 0;
  // Waits for every collective this bucket started in this step.
  virtual void wait() = 0;

 protected:
  ~bucket_io() = default;
};

// The bucket as a hook on `Device` sees it: the same, and the trainer's device.
template <class Device>
class bucket_io_on : public bucket_io {
 public:
  virtual Device& device() noexcept = 0;

 protected:
  ~bucket_io_on() = default;
};

template <class H>
concept policy = requires(H& h, bucket_io& b) {
  requires std::same_as<typename H::slot, slot>;
  { H::name } -> std::convertible_to<std::string_view>;
  h.reduce(b);
  h.finish(b);
};

struct none {
  using slot = comm_hook::slot;
  static constexpr std::string_view name = "none";
  static constexpr bool capturable = true;  // ddp::cuda::step_graph may hold it
  static constexpr bool plain = true;       // the update policy's own collective, unchanged
  void reduce(bucket_io& b) { b.reduce_gradients(); }
  void finish(bucket_io&) {}
};

// Whether the hook declares that it leaves the gradients to the update policy's own collective,
// unchanged (`plain`); a one_of is plain when every hook it offers is.
// A hook that derives from none declares plain only by declaring it again: what it inherits
// says nothing of what its own reduce does.
template <class H>
consteval bool is_plain() {
  if constexpr (!requires { { H::plain } -> std::convertible_to<bool>; }) return false;
  else if constexpr (std::is_base_of_v<none, H> && !std::is_same_v<H, none>) return &H::plain != &none::plain && H::plain;
  else return H::plain;
}

template <dtype Low>
struct compress {
  static_assert(Low == dtype::f16 || Low == dtype::bf16, "ddp: comm_hook::compress takes dtype::f16 or dtype::bf16");
  using slot = comm_hook::slot;
  static constexpr std::string_view name = Low == dtype::f16 ? "fp16" : "bf16";
  static constexpr bool capturable = true;

  void reduce(bucket_io& b) {
    const std::size_t n = b.size();
    void* low = b.scratch(0, n * size_of(Low));
    b.cast(const_buffer{b.gradients(), n, dtype::f32}, mutable_buffer{low, n, Low},
           1.0f / static_cast<float>(b.ranks()));
    b.reduce_like_gradients(mutable_buffer{low, n, Low}, reduce_op::sum);
  }
  void finish(bucket_io& b) {
    b.wait();
    auto* low = static_cast<char*>(b.scratch(0, b.size() * size_of(Low))) + b.shard_begin() * size_of(Low);
    b.cast(const_buffer{low, b.shard(), Low}, mutable_buffer{b.gradients() + b.shard_begin(), b.shard(), dtype::f32},
           1.0f);
  }
};

using fp16 = compress<dtype::f16>;
using bf16 = compress<dtype::bf16>;

// One of several hooks, chosen while the program runs (a command-line flag), in one trainer type:
// `trainer.policy<ddp::comm_hook::slot>().select("bf16")` between steps (ddp/policy/one_of.hpp).
template <policy... Hooks>
struct one_of : ddp::policy::run_time_choice<comm_hook::slot, Hooks...> {
  using slot = comm_hook::slot;
  static constexpr std::string_view name = "one_of";
  static constexpr bool plain = (is_plain<Hooks>() && ...);
  // Whether the hook selected now is plain.
  bool selected_plain() const {
    return this->visit([](const auto& h) { return is_plain<std::remove_cvref_t<decltype(h)>>(); });
  }
  // Templates, so that a hook that takes bucket_io_on<Device> gets it.
  template <class IO>
  void reduce(IO& b) {
    this->visit([&](auto& h) { h.reduce(b); });
  }
  template <class IO>
  void finish(IO& b) {
    this->visit([&](auto& h) { h.finish(b); });
  }
};

struct slot {
  static constexpr std::string_view name = "comm_hook";
  using default_policy = none;
};

template <class H>
consteval bool diagnose() {
  static_assert(requires { { H::name } -> std::convertible_to<std::string_view>; },
                "ddp: a policy in the comm_hook slot lacks `static constexpr std::string_view name`");
  static_assert(requires(H& h, bucket_io& b) { h.reduce(b); },
                "ddp: a policy in the comm_hook slot lacks `void reduce(ddp::comm_hook::bucket_io&)`, which starts "
                "a bucket's reduction (see ddp/policy/comm_hook.hpp)");
  static_assert(requires(H& h, bucket_io& b) { h.finish(b); },
                "ddp: a policy in the comm_hook slot lacks `void finish(ddp::comm_hook::bucket_io&)`, which leaves "
                "the averaged gradients in place before the optimizer (see ddp/policy/comm_hook.hpp)");
  return policy<H>;
}

}  // namespace ddp::policy::comm_hook

// The slot's short spelling, as policy lists write it: ddp::comm_hook::... is ddp::policy::comm_hook::...
namespace ddp {
namespace comm_hook = policy::comm_hook;
}  // namespace ddp
