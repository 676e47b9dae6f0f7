#pragma once
// How a communicator member issues its collective. `ddp::asynchronous`, the default, returns a
// work handle at once. `ddp::blocking` is an optional form a backend may offer: it returns once
// the collective is done, with no handle, and a host backend then runs a collective that
// nothing is queued before on the calling thread, with no hand-over and nothing allocated. The
// free functions in ddp/comm/collectives.hpp take the blocking form where a backend has one.
#include <concepts>

namespace ddp {

struct asynchronous_t {
  explicit constexpr asynchronous_t() = default;
};
struct blocking_t {
  explicit constexpr blocking_t() = default;
};
inline constexpr asynchronous_t asynchronous{};
inline constexpr blocking_t blocking{};

template <class T>
concept issue_mode = std::same_as<T, asynchronous_t> || std::same_as<T, blocking_t>;

}  // namespace ddp
