#pragma once
// Runs the trainer's collective operations so that no rank is left waiting: a failure leaves the
// trainer unusable and, unless every rank raised it alike (a collective_error), aborts the
// communicator, since peers may be waiting in a collective this rank will never issue.
#include <exception>
#include <optional>
#include <string>

#include "ddp/concepts/communicator.hpp"
#include "ddp/core/error.hpp"

namespace ddp::detail {

template <communicator Comm>
class step_guard {
 public:
  explicit step_guard(Comm& comm) noexcept : comm_(comm) {}

  // Runs `work` (`operation` names it in errors).
  template <class F>
  decltype(auto) run(const char* operation, F&& work) {
    if (const auto why = refusal()) throw error("trainer", operation, comm_.rank(), *why);
    try {
      return work();
    } catch (const collective_error& e) {
      broken_ = e.what();  // every rank raises this one: nobody waits
      throw;
    } catch (const std::exception& e) {
      broken_ = e.what();
      comm_.abort(e.what());
      throw;
    }
  }

  // Why the trainer cannot run another operation, or nothing.
  std::optional<std::string> refusal() const {
    if (!broken_) return std::nullopt;
    return "the trainer is unusable after a failed step: " + *broken_;
  }

 private:
  Comm& comm_;
  std::optional<std::string> broken_;
};

}  // namespace ddp::detail
