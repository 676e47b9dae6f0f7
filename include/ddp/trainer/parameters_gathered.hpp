#pragma once
// Sharded parameters (update::fully_sharded) gathered for a scope that reads the whole model
// between steps: an evaluation, a checkpoint. The parameter residency offers gather_all() and
// release_all() (trainer/parameter_residency.hpp); under other update policies both do nothing.

namespace ddp::detail {

// Every parameter gathered for a scope that reads the whole model between steps (an evaluation, a
// checkpoint); released after it, unless they were gathered before. Collective.
template <class Residency>
class parameters_gathered {
 public:
  explicit parameters_gathered(Residency& r) : r_(r), release_(r.gather_all()) {}
  parameters_gathered(const parameters_gathered&) = delete;
  parameters_gathered& operator=(const parameters_gathered&) = delete;
  ~parameters_gathered() {
    if (release_) r_.release_all();
  }

 private:
  Residency& r_;
  bool release_;
};

}  // namespace ddp::detail
