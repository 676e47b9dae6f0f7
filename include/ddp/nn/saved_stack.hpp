#pragma once
// What a host layer's training forwards save for their backwards, innermost last (as
// ddp::nn::pop_saved's stack), keeping the storage of the entries backward has finished with for
// the next forward's: from the second step on, a training step allocates nothing for its saved
// activations, and the memory the allocator would otherwise hand back to the system between
// steps (to fault it in again, page by page, in the next) stays with the layer.
//
//   saved_.push_copy(x);               forward: a copy of x, into spare storage when there is some
//   saved_.push_swap(x);               forward: x's own storage (x an rvalue the layer was handed),
//                                      x left holding the spare storage
//   auto& s = saved_.push();           forward: a new entry to fill (a spare one, with its old
//                                      contents and capacity, or a default one)
//   auto x = saved_.pop("linear");     backward: the innermost entry (*x, x->...); its storage
//                                      returns to the spares when x goes out of scope
//
// The spares hold at most as many entries as the stack ever held at once (one per forward that
// a step runs before its backward).
#include <cstddef>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ddp/nn/matrix.hpp"

namespace ddp::nn {

// m as rows x cols, keeping its storage's capacity; the elements' values are unspecified.
inline void reshape(matrix& m, std::size_t rows, std::size_t cols) {
  m.rows = rows;
  m.cols = cols;
  m.data.resize(rows * cols);
}

// m = x, into m's storage.
inline void assign(matrix& m, const matrix& x) {
  m.rows = x.rows;
  m.cols = x.cols;
  m.data.assign(x.data.begin(), x.data.end());
}

template <class T>
class saved_stack {
 public:
  // The innermost entry, taken off the stack; its storage goes back to the spares on destruction.
  class entry {
   public:
    entry(saved_stack& owner, T value) : owner_(&owner), value_(std::move(value)) {}
    entry(const entry&) = delete;
    entry& operator=(const entry&) = delete;
    ~entry() {
      try {
        owner_->spares_.push_back(std::move(value_));
      } catch (...) {  // no memory for the spare's place: the storage is freed instead
      }
    }
    T& operator*() noexcept { return value_; }
    const T& operator*() const noexcept { return value_; }
    T* operator->() noexcept { return &value_; }
    const T* operator->() const noexcept { return &value_; }

   private:
    saved_stack* owner_;
    T value_;
  };

  saved_stack() = default;
  // A copy starts with no spares of its own (a layer copied or moved keeps its saved entries).
  saved_stack(const saved_stack& other) : stack_(other.stack_) {}
  saved_stack(saved_stack&& other) noexcept : stack_(std::move(other.stack_)) {}
  saved_stack& operator=(const saved_stack& other) {
    stack_ = other.stack_;
    return *this;
  }
  saved_stack& operator=(saved_stack&& other) noexcept {
    stack_ = std::move(other.stack_);
    return *this;
  }

  T& push() {
    if (spares_.empty()) {
      stack_.emplace_back();
    } else {
      stack_.push_back(std::move(spares_.back()));
      spares_.pop_back();
    }
    return stack_.back();
  }

  void push_copy(const T& x)
    requires std::is_same_v<T, matrix>
  {
    assign(push(), x);
  }

  // x itself as the new entry, no copy; x gets the spare storage in its place (its contents
  // unspecified), for the caller to reuse or let go.
  void push_swap(T& x) {
    using std::swap;
    swap(push(), x);
  }

  entry pop(const char* layer) {
    if (stack_.empty())
      throw std::logic_error(std::string("ddp::nn: ") + layer + " backward without a matching training forward");
    T top = std::move(stack_.back());
    stack_.pop_back();
    return entry(*this, std::move(top));
  }

  bool empty() const noexcept { return stack_.empty(); }
  std::size_t size() const noexcept { return stack_.size(); }
  T& back() noexcept { return stack_.back(); }
  const T& back() const noexcept { return stack_.back(); }

 private:
  std::vector<T> stack_, spares_;
};

}  // namespace ddp::nn
