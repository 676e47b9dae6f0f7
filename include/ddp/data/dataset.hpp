#pragma once
// The dataset concept: a sized collection of examples addressed by index.
//   std::size_t size() const;   example_type get(std::size_t index) const;
#include <concepts>
#include <cstddef>

namespace ddp::data {

template <class D>
concept dataset = requires(const D& d, std::size_t i) {
  typename D::example_type;
  { d.size() } -> std::convertible_to<std::size_t>;
  { d.get(i) } -> std::convertible_to<typename D::example_type>;
};

}  // namespace ddp::data
