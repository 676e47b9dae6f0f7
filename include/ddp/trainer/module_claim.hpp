#pragma once
// One trainer per module at a time: a trainer points the module's gradients (and, under the
// sharded updates, its values) into its own memory, so a second trainer on the same module would
// train with the first one's storage underneath it. The claim is process-wide (in-process ranks
// each have their own module) and ends with the trainer.
#include <mutex>
#include <set>
#include <string>

#include "ddp/core/error.hpp"

namespace ddp::detail {

class module_claim {
 public:
  module_claim(const void* module, int rank) : module_(module) {
    std::lock_guard lock(mutex());
    if (!claimed().insert(module).second)
      throw error("trainer", "construct", rank,
                  "this module already has a trainer: a trainer keeps the module's gradients (and under a sharded "
                  "update its parameters) in its own memory, so two at once would train over each other. Destroy "
                  "the first trainer before building another on the module, or give each trainer its own module");
  }
  ~module_claim() {
    std::lock_guard lock(mutex());
    claimed().erase(module_);
  }
  module_claim(const module_claim&) = delete;
  module_claim& operator=(const module_claim&) = delete;

 private:
  static std::set<const void*>& claimed() {
    static std::set<const void*> modules;
    return modules;
  }
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  const void* module_;
};

}  // namespace ddp::detail
