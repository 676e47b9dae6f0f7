#pragma once
// One rank's batches of one epoch, made one at a time as the loop asks for them: a single-pass
// input range that holds the current batch (and, with prefetch, up to `depth` made ahead), never
// the epoch's. The batch type alone names the type, so code that takes an epoch's batches
// (the example's epoch loop) does not depend on the data set or the collate function.
//
//   for (const auto& batch : loader.batches(shard)) ...            // made on this thread
//   ddp::data::loader loader(data, 64, collate, ddp::data::prefetch{2});
//   for (const auto& batch : trainer.epoch(loader)) ...            // made on a thread of its own,
//                                                                  // at most 2 ahead of the step
//
// With prefetch, a producer thread makes the batches in order into a bounded queue. An
// exception it meets reaches the loop at that batch, after the ones made before it; leaving the
// loop early (break, or an exception in the step) stops the producer and joins it.
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ddp/core/error.hpp"

namespace ddp::data {

// How many batches a loader makes ahead of the step on a thread of its own (0: none, no thread).
struct prefetch {
  std::size_t depth = 0;
};

template <class Batch>
class batch_stream {
 public:
  // make(i) returns batch i of the epoch, for i in [0, count), called in order.
  using make_function = std::function<Batch(std::size_t)>;

  batch_stream(std::size_t count, make_function make, prefetch ahead = {})
      : state_(std::make_unique<state>(count, std::move(make), ahead.depth)) {}
  batch_stream(batch_stream&&) noexcept = default;
  batch_stream& operator=(batch_stream&& other) noexcept {
    if (this != &other) {
      stop();
      state_ = std::move(other.state_);
    }
    return *this;
  }
  ~batch_stream() { stop(); }

  // The batches this stream yields (after skip()).
  std::size_t size() const noexcept { return state_->count - state_->position; }
  std::size_t prefetch_depth() const noexcept { return state_->depth; }

  // Starts at batch n instead of 0 (a checkpoint resumed in the middle of an epoch: the trainer
  // skips the batches taken before it); nothing is made for them. Before begin() only.
  void skip(std::size_t n) {
    state& s = *state_;
    if (s.started || n > s.count - s.position)
      throw error("data", "batch_stream", -1,
                  s.started ? "skip() after the stream has begun" : "skip(" + std::to_string(n) + ") past the end of " +
                                                                         std::to_string(s.count - s.position) + " batches");
    s.position += n;
  }

  class iterator;
  // Single pass: the first begin() starts the epoch, a second one is an error. (const, so that
  // `const auto batches = trainer.epoch(loader)` can be looped over, as a vector could.)
  iterator begin() const {
    state& s = *state_;
    if (s.started)
      throw error("data", "batch_stream", -1,
                  "an epoch's batches are a single pass and this one has begun; ask the loader (or "
                  "trainer.epoch) for a new one, or keep them with to_vector()");
    s.started = true;
    if (s.depth > 0 && s.position < s.count) start_producer(s);
    if (s.position < s.count) fetch(s);
    return iterator(&s);
  }
  std::default_sentinel_t end() const noexcept { return {}; }

  // Every remaining batch, kept (for tests and benchmarks that go over them more than once).
  std::vector<Batch> to_vector() const {
    std::vector<Batch> out;
    out.reserve(size());
    for (auto& b : *this) out.push_back(std::move(b));
    return out;
  }

 private:
  struct state {
    state(std::size_t n, make_function m, std::size_t d) : count(n), make(std::move(m)), depth(d) {}
    const std::size_t count;
    make_function make;
    const std::size_t depth;
    bool started = false;
    std::size_t position = 0;  // of the batch in `current`
    std::optional<Batch> current;
    // The producer's side (prefetch only).
    std::mutex mutex;
    std::condition_variable changed;
    std::deque<Batch> ready;
    std::exception_ptr failure;  // met by the producer after the batches in `ready`
    bool stopping = false;
    std::thread producer;
  };

  static void start_producer(state& st) {
    state* s = &st;
    s->producer = std::thread([s, first = s->position] {
      for (std::size_t i = first; i < s->count; ++i) {
        std::optional<Batch> b;
        try {
          b.emplace(s->make(i));
        } catch (...) {
          std::lock_guard lock(s->mutex);
          s->failure = std::current_exception();
          s->changed.notify_all();
          return;
        }
        std::unique_lock lock(s->mutex);
        s->changed.wait(lock, [s] { return s->stopping || s->ready.size() < s->depth; });
        if (s->stopping) return;
        s->ready.push_back(std::move(*b));
        s->changed.notify_all();
      }
    });
  }

  // Puts batch `position` in `current`.
  static void fetch(state& s) {
    if (s.depth == 0) {
      s.current.reset();
      s.current.emplace(s.make(s.position));
      return;
    }
    std::unique_lock lock(s.mutex);
    s.changed.wait(lock, [&s] { return !s.ready.empty() || s.failure; });
    if (s.ready.empty()) std::rethrow_exception(s.failure);
    s.current.reset();
    s.current.emplace(std::move(s.ready.front()));
    s.ready.pop_front();
    s.changed.notify_all();
  }

  static void advance(state& s) {
    if (++s.position < s.count) fetch(s);
    else s.current.reset();
  }

  void stop() noexcept {
    if (!state_ || !state_->producer.joinable()) return;
    {
      std::lock_guard lock(state_->mutex);
      state_->stopping = true;
    }
    state_->changed.notify_all();
    state_->producer.join();
  }

  std::unique_ptr<state> state_;

 public:
  class iterator {
   public:
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    using reference = Batch&;
    using iterator_category = std::input_iterator_tag;
    iterator() = default;
    Batch& operator*() const { return *s_->current; }
    Batch* operator->() const { return &*s_->current; }
    iterator& operator++() {
      advance(*s_);
      return *this;
    }
    void operator++(int) { ++*this; }
    friend bool operator==(const iterator& it, std::default_sentinel_t) {
      return it.s_ == nullptr || it.s_->position >= it.s_->count;
    }

   private:
    friend class batch_stream;
    explicit iterator(state* s) : s_(s) {}
    state* s_ = nullptr;
  };
};

}  // namespace ddp::data
