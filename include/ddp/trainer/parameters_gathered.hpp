#pragma once
// Sharded parameters (update::fully_sharded) gathered for a scope that reads the whole model
// between steps: an evaluation, a checkpoint. The reducer offers gather_parameters() and
// release_parameters() (trainer/gradient_reducer.hpp); under other update policies both do nothing.

namespace ddp::detail {

// Every parameter gathered for a scope that reads the whole model between steps (an evaluation, a
// checkpoint); released after it, unless they were gathered before. Collective.
template <class Reducer>
class parameters_gathered {
 public:
  explicit parameters_gathered(Reducer& r) : r_(r), release_(r.gather_parameters()) {}
  parameters_gathered(const parameters_gathered&) = delete;
  parameters_gathered& operator=(const parameters_gathered&) = delete;
  ~parameters_gathered() {
    if (release_) r_.release_parameters();
  }

 private:
  Reducer& r_;
  bool release_;
};

}  // namespace ddp::detail
