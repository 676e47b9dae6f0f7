#pragma once
// Deferred buffer updates of layers in a row (ddp::nn::sequential, ddp::nn::residual): the layers
// that keep running statistics (ddp::nn::batch_norm) record each training forward's update
// instead of applying it; a record of the row is its layers' records of one forward, in layer
// order (ddp::defers_buffer_updates, reduction::invariant). And the random streams of the layers
// that draw (ddp::nn::dropout), keyed per virtual shard under the same policy.
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace ddp::nn::detail {

template <class Layer>
concept defers_updates = requires(Layer& l, bool on) { l.defer_buffer_updates(on); };

template <class Tuple, class F>
void for_each_deferring(Tuple& layers, F&& f) {
  std::apply([&](auto&... l) { (..., [&](auto& one) {
                                 if constexpr (defers_updates<std::remove_reference_t<decltype(one)>>) f(one);
                               }(l)); },
             layers);
}

// The layers that draw random numbers take their draws from `stream` (reduction::invariant).
template <class Tuple>
void set_random_stream(Tuple& layers, std::uint64_t stream) {
  std::apply([&](auto&... l) { (..., [&](auto& one) {
                                 if constexpr (requires { one.set_random_stream(stream); }) one.set_random_stream(stream);
                               }(l)); },
             layers);
}

template <class Tuple>
void defer_buffer_updates(Tuple& layers, bool on) {
  for_each_deferring(layers, [&](auto& l) { l.defer_buffer_updates(on); });
}

template <class Tuple>
std::size_t buffer_update_size(Tuple& layers) {
  std::size_t size = 0;
  for_each_deferring(layers, [&](auto& l) { size += l.buffer_update_size(); });
  return size;
}

// The layers' records since the last take, one forward's after another.
template <class Tuple>
std::vector<float> take_buffer_updates(Tuple& layers) {
  std::vector<std::vector<float>> each;
  std::vector<std::size_t> sizes;
  for_each_deferring(layers, [&](auto& l) {
    each.push_back(l.take_buffer_updates());
    sizes.push_back(l.buffer_update_size());
  });
  std::vector<float> records;
  std::size_t forwards = 0;  // from any layer that records something (a residual without batch norm does not)
  for (std::size_t k = 0; k < each.size(); ++k)
    if (sizes[k] != 0) forwards = each[k].size() / sizes[k];
  for (std::size_t k = 0; k < each.size(); ++k)
    if (each[k].size() != forwards * sizes[k])
      throw std::logic_error("ddp::nn: layer " + std::to_string(k) + " of those that defer buffer updates holds " +
                             std::to_string(each[k].size()) + " floats of records, not " + std::to_string(forwards) +
                             " forwards of " + std::to_string(sizes[k]) +
                             ": its buffer_update_size() must be what each training forward records (0 for none)");
  for (std::size_t f = 0; f < forwards; ++f)
    for (std::size_t k = 0; k < each.size(); ++k)
      if (sizes[k] != 0)
        records.insert(records.end(), each[k].begin() + static_cast<std::ptrdiff_t>(f * sizes[k]),
                       each[k].begin() + static_cast<std::ptrdiff_t>((f + 1) * sizes[k]));
  return records;
}

template <class Tuple>
void apply_buffer_updates(Tuple& layers, std::span<const float> records, const char* who) {
  const std::size_t size = buffer_update_size(layers);
  if (size == 0 ? !records.empty() : records.size() % size != 0)
    throw std::invalid_argument(std::string("ddp::nn::") + who + ": " + std::to_string(records.size()) +
                                " floats of buffer updates are not whole records of " + std::to_string(size));
  for (std::size_t at = 0; size != 0 && at < records.size(); at += size) {
    std::size_t offset = at;
    for_each_deferring(layers, [&](auto& l) {
      l.apply_buffer_updates(records.subspan(offset, l.buffer_update_size()));
      offset += l.buffer_update_size();
    });
  }
}

}  // namespace ddp::nn::detail
