#pragma once
// The buckets' checkpoint sections: "buckets" (the layout: numel, padded, shard begin and shard
// of each) and the communication hook's state kept per bucket ("hook_state", an index of bucket,
// slot and floats, and "hook_state/<bucket>/<slot>"). The hook's state is this rank's own (error
// feedback): restored at the same world size (one file), and started afresh at another.
#include <array>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ddp/concepts/device.hpp"
#include "ddp/concepts/device_array.hpp"
#include "ddp/trainer/checkpoint_file.hpp"

namespace ddp::detail {

inline std::string hook_state_name(std::size_t bucket, std::size_t slot) {
  return "hook_state/" + std::to_string(bucket) + "/" + std::to_string(slot);
}
// A checkpoint's communication-hook state: bucket, slot, floats of each (none when no hook kept state).
inline std::vector<std::array<std::size_t, 3>> hook_state_index(const checkpoint_file& f) {
  if (!f.has("meta/hook_state")) return {};
  return number_rows<3>(f.text("hook_state"));
}

template <class Bucket, device Device>
void write_bucket_sections(checkpoint_file& f, std::span<const Bucket> buckets, Device& dev) {
  std::string layout, hook_index;
  for (const auto& bk : buckets)
    layout += std::to_string(bk.numel()) + " " + std::to_string(bk.padded()) + " " +
              std::to_string(bk.shard_begin()) + " " + std::to_string(bk.shard()) + "\n";
  f.set_text("buckets", layout);
  // "bucket slot floats" per line.
  for (const auto& bk : buckets)
    for (std::size_t k = 0; k < bk.hook_state().size(); ++k) {
      const auto& a = bk.hook_state()[k];
      if (a.size() == 0) continue;
      std::vector<float> v(a.size());
      dev.copy_to_host(v.data(), a.data(), v.size() * sizeof(float));
      f.set_array(hook_state_name(bk.index(), k), std::span<const float>(v));
      hook_index += std::to_string(bk.index()) + " " + std::to_string(k) + " " + std::to_string(v.size()) + "\n";
    }
  if (!hook_index.empty()) f.set_text("hook_state", hook_index);
}

// The bucket layout (checked first) and the hook's state (checked last).
template <class Bucket>
std::optional<std::string> check_bucket_layout(const checkpoint_file& f, std::span<const Bucket> buckets) {
  std::string sizes, theirs;
  for (const auto& bk : buckets) sizes += std::to_string(bk.numel()) + " ";
  for (const auto& row : number_rows<4>(f.text("buckets"))) theirs += std::to_string(row[0]) + " ";
  if (sizes != theirs)
    return "'" + f.path() + "' was written with buckets of " + theirs + "elements, this trainer has " + sizes +
           "(another bucket_cap): build the trainer with the checkpoint's bucket_cap";
  return std::nullopt;
}
inline std::optional<std::string> check_hook_state(const checkpoint_file& f, std::size_t buckets) {
  for (const auto& [bucket, slot, floats] : hook_state_index(f)) {
    if (bucket >= buckets || slot > 64)
      return "'" + f.path() + "' holds communication-hook state for bucket " + std::to_string(bucket) + " slot " +
             std::to_string(slot) + ", which this trainer does not have";
    const auto name = hook_state_name(bucket, slot);
    if (!f.has(name) || f.section(name).size() % sizeof(float) || f.section(name).size() / sizeof(float) != floats)
      return "'" + f.path() + "': its communication-hook state '" + name +
             "' is missing or of another size than its index says";
  }
  return std::nullopt;
}

template <class Bucket, device Device>
void read_hook_state(const std::vector<checkpoint_file>& files, std::span<Bucket> buckets, Device& dev) {
  for (auto& bk : buckets) bk.hook_state().clear();
  if (files.size() != 1) return;
  for (const auto& [bucket, slot, floats] : hook_state_index(files[0])) {
    auto& arrays = buckets[bucket].hook_state();
    if (arrays.size() <= slot) arrays.resize(slot + 1);
    arrays[slot] = device_array<Device, float>(dev, floats);
    const auto v = files[0].array<float>(hook_state_name(bucket, slot), floats);
    dev.copy_from_host(arrays[slot].data(), v.data(), floats * sizeof(float));
  }
}

}  // namespace ddp::detail
