#pragma once
// A mismatch injected on one rank: the collectives of a short run, and what one rank issues
// instead at collective #2, for the flight recorder's and the checking mode's tests.
#include <vector>

#include "ddp/comm/flight_recorder.hpp"
#include "ddp/core/buffer.hpp"

namespace mismatch {

namespace dc = ddp::comm;

// The collectives every rank issues: #0 broadcast of the buffers, #1 a step-0 bucket, then in
// step 1 #2 bucket 1's gradients (16 floats), #3 bucket 0's (8 floats), #4 the control floats.
// `inject` may replace what `odd_rank` issues at #2.
enum class injected { none, op, count, dtype, root, extra, skipped };

// #0 and #1, which every rank issues alike, on `a` (16 floats).
template <class Comm>
void issue_first_step(Comm& comm, std::vector<float>& a) {
  {
    dc::tag_scope buffers(dc::purpose::buffer_sync);
    comm.broadcast(ddp::mutable_buffer{a.data(), 16, ddp::dtype::f32}, 0).wait();
  }
  dc::step_scope step(0);
  dc::tag_scope bucket(dc::purpose::gradients, 0);
  comm.all_reduce(ddp::const_buffer{a.data(), 8, ddp::dtype::f32}, ddp::mutable_buffer{a.data(), 8, ddp::dtype::f32},
                  ddp::reduce_op::avg)
      .wait();
}

template <class Comm>
void issue_steps(Comm& comm, injected inject, int odd_rank = 2) {
  std::vector<float> a(16, 1.0f), gathered(16 * static_cast<std::size_t>(comm.size()));
  std::vector<double> d(16, 1.0);
  const bool odd = comm.rank() == odd_rank;
  issue_first_step(comm, a);
  dc::step_scope step(1);
  {
    dc::tag_scope bucket(dc::purpose::gradients, 1);
    const ddp::mutable_buffer x{a.data(), 16, ddp::dtype::f32};
    if (odd && inject == injected::op) {
      comm.all_gather(ddp::const_buffer{a.data(), 16, ddp::dtype::f32},
                      ddp::mutable_buffer{gathered.data(), gathered.size(), ddp::dtype::f32})
          .wait();
    } else if (odd && inject == injected::count) {
      comm.all_reduce(ddp::const_buffer{a.data(), 12, ddp::dtype::f32}, ddp::mutable_buffer{a.data(), 12, ddp::dtype::f32},
                      ddp::reduce_op::avg)
          .wait();
    } else if (odd && inject == injected::dtype) {
      comm.all_reduce(ddp::const_buffer{d.data(), 16, ddp::dtype::f64}, ddp::mutable_buffer{d.data(), 16, ddp::dtype::f64},
                      ddp::reduce_op::avg)
          .wait();
    } else if (odd && inject == injected::root) {
      comm.broadcast(x, 1).wait();  // the others broadcast from 0 here
    } else if (odd && inject == injected::extra) {
      dc::tag_scope control(dc::purpose::control);
      comm.barrier().wait();
    } else if (!(odd && inject == injected::skipped)) {
      if (inject == injected::root) comm.broadcast(x, 0).wait();
      else comm.all_reduce(ddp::const_buffer{x.data, 16, x.type}, x, ddp::reduce_op::avg).wait();
    }
  }
  {
    dc::tag_scope bucket(dc::purpose::gradients, 0);
    comm.all_reduce(ddp::const_buffer{a.data(), 8, ddp::dtype::f32}, ddp::mutable_buffer{a.data(), 8, ddp::dtype::f32},
                    ddp::reduce_op::avg)
        .wait();
  }
  dc::tag_scope control(dc::purpose::control);
  comm.all_reduce(ddp::const_buffer{a.data(), 2, ddp::dtype::f32}, ddp::mutable_buffer{a.data(), 2, ddp::dtype::f32},
                  ddp::reduce_op::sum)
      .wait();
}

struct injection {
  injected what;
  const char* kind;       // the verdict's kind
  const char* odd_issue;  // what the odd rank issued at #2, as the verdict and the checking mode describe it
};


inline constexpr injection injections[] = {
    {injected::op, "op", "all_gather"},
    {injected::count, "count", "all_reduce #2 (count 12, f32, avg; step 1, bucket 1, gradients"},
    {injected::dtype, "dtype", "all_reduce #2 (count 16, f64, avg; step 1, bucket 1, gradients"},
    {injected::root, "root", "broadcast #2 (count 16, f32, root 1; step 1, bucket 1, gradients"},
    {injected::extra, "op", "barrier #2 (count 0, u8; step 1, control"},
    {injected::skipped, "count", "all_reduce #2 (count 8, f32, avg; step 1, bucket 0, gradients"},
};

}  // namespace mismatch
