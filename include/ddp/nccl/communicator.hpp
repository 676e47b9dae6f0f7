#pragma once
// The NCCL communicator: one rank per GPU, CUDA memory, collectives on a communication stream.
//
//   ddp::cuda::device dev(local_rank, rank);
//   auto comm = ddp::nccl::bootstrap(host_comm, dev);   // host_comm: inproc or mpi
//
// Ordering: a collective observes every write queued on the device's compute stream before the
// call (an event recorded there, which the communication stream waits for), so a bucket's
// reduction starts as soon as backward has produced it and runs beside the rest of backward.
// wait() orders the compute stream after the collective and returns at once: work the caller
// queues there afterwards reads the result, and the host never waits for a collective (it waits
// only where it reads a value: copy_to_host).
//
// Failure: NCCL by itself lets a rank wait forever for a peer that died. Here a watchdog thread
// per communicator aborts it (ncclCommAbort) when a collective runs past options.timeout, when
// NCCL reports an asynchronous error, or when a peer gave up (heard through the host communicator
// that bootstrapped it); every later collective then throws ddp::peer_error (or
// ddp::timeout_error) naming the rank at fault, and so does work.rethrow_failure(), which a
// caller that read a collective's result on the host (after copy_to_host) calls before trusting
// it: an aborted collective still completes on the stream. The failure is latched before NCCL is
// aborted, so it is visible by the time the stream gets past the collective. abort(reason) does
// the same from this rank. NCCL runs non-blocking: its start-up (bounded by options.init_timeout)
// and the connections a collective first needs (bounded by options.timeout, like the collective)
// finish in the background while they wait for the peers, and the watchdog can abort either
// (supervisor.hpp holds that logic, apart from NCCL so that a host test drives it).
//
// Every buffer's pointer attributes are checked against the communicator's GPU before the
// collective is queued; a mismatch names the buffer and both devices.
#include <nccl.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ddp/concepts/communicator.hpp"
#include "ddp/cuda/device.hpp"
#include "ddp/nccl/check.hpp"
#include "ddp/nccl/supervisor.hpp"

namespace ddp::nccl {

namespace detail {

inline constexpr std::string_view communicator_name = "nccl";

struct pending {
  pending(cuda::call_site site, const char* n, std::uint64_t seq) : started(site), done(site), name(n), sequence(seq) {}
  cuda::event started;  // reached on NCCL's stream: the compute before it has finished
  cuda::event done;     // recorded once NCCL has queued the collective
  const char* name;
  std::uint64_t sequence;
  // The supervisor's, under its watch lock: when its clock started; whether NCCL is still
  // queueing it (then `done` is not recorded yet and means nothing).
  std::optional<clock::time_point> seen_started;
  bool settling = false;
  bool captured = false;  // queued while the compute stream was being captured into a CUDA graph

  bool reached() const { return started.done(); }
  bool finished() const { return done.done(); }
};

// Finished collectives' events, kept for the next ones: two new CUDA events per collective cost
// more host time than queueing the collective. A pending goes back when its last holder (a work
// handle, the watchdog's list) lets go; at most `kept` wait here.
class pending_pool : public std::enable_shared_from_this<pending_pool> {
 public:
  static constexpr std::size_t kept = 64;

  std::shared_ptr<pending> take(cuda::call_site site, const char* name, std::uint64_t sequence) {
    std::unique_ptr<pending> p;
    {
      std::lock_guard lock(mutex_);
      if (!free_.empty()) {
        p = std::move(free_.back());
        free_.pop_back();
      }
    }
    if (p) {
      p->name = name;
      p->sequence = sequence;
      p->seen_started.reset();
      p->settling = false;
      p->captured = false;
    } else {
      p = std::make_unique<pending>(site, name, sequence);
    }
    return {p.release(), [pool = shared_from_this()](pending* q) { pool->give_back(q); }};
  }

 private:
  void give_back(pending* q) noexcept {
    std::unique_ptr<pending> owned(q);
    try {
      std::lock_guard lock(mutex_);
      if (free_.size() < kept) free_.push_back(std::move(owned));
    } catch (...) {  // no room to keep it: its events go
    }
  }
  std::mutex mutex_;
  std::vector<std::unique_ptr<pending>> free_;
};

// The NCCL communicator as the supervisor sees it (every call under its lock).
struct nccl_handle {
  ncclComm_t comm = nullptr;

  bool live() const noexcept { return comm != nullptr; }
  // A status of a non-blocking call, described while the communicator still lives.
  call_result result(ncclResult_t r, const char* operation) const {
    if (r == ncclSuccess) return {call_state::done, {}};
    if (r == ncclInProgress) return {call_state::in_progress, {}};
    return {call_state::failed, describe(r, comm, operation ? operation : "")};
  }
  call_result poll(const char* operation) const {
    ncclResult_t state = ncclInProgress;
    const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    return result(r != ncclSuccess ? r : state, operation);
  }
  void abort() noexcept {
    if (comm) ncclCommAbort(comm);
    comm = nullptr;
  }
  bool revoke() noexcept {
    if (!comm) return false;
    const ncclResult_t r = ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT);
    return r == ncclSuccess || r == ncclInProgress;
  }
  call_result finalize() { return result(ncclCommFinalize(comm), "ncclCommFinalize"); }
  void destroy() noexcept {
    if (comm) ncclCommDestroy(comm);
    comm = nullptr;
  }
};

// Everything a communicator and its work handles share; the watchdog thread works on it too.
class core {
 public:
  core(cuda::device& dev, int rank, int size, const ncclUniqueId& id, peer_channel channel, options opts)
      : core(dev, rank, size, std::move(channel), opts, [&](nccl_handle& h) {
          ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
          config.blocking = 0;  // so a set-up that waits for a missing peer can be aborted
          return h.result(ncclCommInitRankConfig(&h.comm, size, id, rank, &config), "ncclCommInitRankConfig");
        }) {}

  // The ranks of `parent` but those in `excluded` (old ranks, sorted), renumbered in their old
  // order: ncclCommShrink, once the parent is quiescent (a revoked one: its collectives stopped).
  core(core& parent, const std::vector<int>& excluded, peer_channel channel, options opts)
      : core(parent.device(), shrunk_rank(parent, excluded), parent.size() - static_cast<int>(excluded.size()),
             std::move(channel), opts, [&](nccl_handle& h) {
               ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
               config.blocking = 0;
               std::vector<int> gone = excluded;
               // A parent in NCCL's error state (a peer died in a collective) ends its operations first.
               return parent.supervisor_.when_quiescent("ncclCommShrink", [&](nccl_handle& p, bool errored) {
                 return h.result(ncclCommShrink(p.comm, gone.data(), static_cast<int>(gone.size()), &h.comm, &config,
                                                errored ? NCCL_SHRINK_ABORT : NCCL_SHRINK_DEFAULT),
                                 "ncclCommShrink");
               });
             }) {}
  core(const core&) = delete;
  core& operator=(const core&) = delete;

  ~core() {
    supervisor_.close();
    device_->deallocate(scratch_, sizeof(float));
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  cuda::device& device() const noexcept { return *device_; }
  float* scratch() const noexcept { return scratch_; }

  // Queues `call(comm, stream)` after the compute stream's work; returns what wait() needs.
  template <class Call>
  std::shared_ptr<pending> enqueue(const char* name, Call call, std::size_t count, dtype type,
                                   reduce_op op = reduce_op::sum, int root = -1) {
    throw_if_failed(name);
    device_->activate();
    auto p = pool_->take(device_->site(), name, recorder_.issued(name, count, type, op, root));
    ready_.record(device_->stream());
    stream_.wait(ready_.get());
    p->started.record(stream_.get());
    // Captured into a graph, the collective runs only when the graph is launched: the watchdog
    // cannot query its events (they belong to the capture), and watches the launch instead.
    const bool captured = device_->capturing();
    try {
      supervisor_.submit(
          p, [&](nccl_handle& h) { return h.result(call(h.comm, stream_.get()), name); },
          [&] {
            p->done.record(stream_.get());
            p->captured = captured;
            return !captured;
          });
    } catch (...) {
      order_after_communication();
      throw;
    }
    return p;
  }

  // Orders the compute stream after `p`, without waiting on the host: the watchdog owns the
  // timeout. A collective it aborts (a peer died, the timeout passed) still completes on the
  // stream, with whatever its buffers held; the failure is latched before NCCL is aborted, so a
  // caller that synchronised with the compute stream afterwards sees it in rethrow_failure().
  // The stream is ordered first and the failure reported after: memory the caller frees on the
  // compute stream (cudaFreeAsync) is then not reused while the aborted collective still writes it.
  void wait(const pending& p) {
    device_->activate();
    const cudaError_t ordered = cudaStreamWaitEvent(device_->stream(), p.done.get(), 0);
    throw_if_failed(p.name);  // the latched failure first: it names the rank at fault
    cuda::check(ordered, "cudaStreamWaitEvent", device_->site());
  }

  // True once the collective has finished on the GPU, or failed.
  bool test(const pending& p) const noexcept {
    if (supervisor_.failed()) return true;
    if (p.captured) return false;  // its events belong to a graph being captured: not queryable
    try {
      return p.done.done();
    } catch (...) {
      return true;  // a device error: rethrow_failure() reports it once the watchdog has
    }
  }

  // Puts work the caller queues on the compute stream in `queue()` (a CUDA graph's launch) under
  // the watchdog, as one collective named `name`: it fails every rank when it runs past the
  // timeout, or when NCCL or a peer fails while it runs.
  template <class Queue>
  std::shared_ptr<pending> watch(const char* name, Queue queue) {
    throw_if_failed(name);
    device_->activate();
    auto p = pool_->take(device_->site(), name, recorder_.issued(name, 0, dtype::u8));
    p->started.record(device_->stream());
    queue();
    p->done.record(device_->stream());
    supervisor_.track(p);
    return p;
  }

  void abort(const std::string& reason) {
    supervisor_.fail({rank_, "rank " + std::to_string(rank_) + " failed: " + reason, false}, /*tell_peers=*/true);
  }

  void throw_if_failed(const char* operation) const { supervisor_.throw_if_failed(operation); }
  const options& settings() const noexcept { return supervisor_.settings(); }
  comm::flight_recorder& recorder() noexcept { return recorder_; }

 private:
  template <class Init>
  core(cuda::device& dev, int rank, int size, peer_channel channel, options opts, Init init)
      : device_(&dev), rank_(rank), size_(size), stream_(dev.site(), cuda::stream::greatest_priority(dev.site())),
        ready_(dev.site()),
        recorder_(communicator_name, rank, size, opts.recorder.value_or(comm::recorder_options::from_environment())),
        supervisor_(rank, dev.id().to_string(), opts, std::move(channel), nccl_handle{}, &recorder_) {
    if (size < 1 || rank < 0 || rank >= size)
      throw error("nccl", "communicator", rank, "rank " + std::to_string(rank) + " is outside a world of size " +
                                                    std::to_string(size));
    dev.activate();
    scratch_ = static_cast<float*>(dev.allocate(sizeof(float)));
    try {
      supervisor_.start(init);
    } catch (...) {
      dev.deallocate(scratch_, sizeof(float));
      throw;
    }
    supervisor_.start_watching([ordinal = dev.ordinal()] { cudaSetDevice(ordinal); });
  }

  // This rank's number among the ranks that remain; the excluded list must name other ranks.
  static int shrunk_rank(const core& parent, const std::vector<int>& excluded) {
    if (excluded.empty())
      throw error("nccl", "shrink", parent.rank(),
                  "no rank is excluded: NCCL shrinks a communicator by the ranks it leaves out; name the failed ranks");
    int below = 0;
    for (std::size_t i = 0; i < excluded.size(); ++i) {
      const int r = excluded[i];
      if (r < 0 || r >= parent.size() || (i > 0 && r <= excluded[i - 1]))
        throw error("nccl", "shrink", parent.rank(),
                    "the excluded ranks must be distinct ranks of the communicator (0 to " +
                        std::to_string(parent.size() - 1) + "), in increasing order; " + std::to_string(r) + " is not");
      if (r == parent.rank())
        throw error("nccl", "shrink", parent.rank(),
                    "rank " + std::to_string(r) + " is excluded: only the ranks that remain call shrink");
      if (r < parent.rank()) ++below;
    }
    return parent.rank() - below;
  }

  // After a collective failed while NCCL was queueing it, part of it may have reached NCCL's
  // stream: the compute stream waits for that stream (best effort, errors ignored), so memory
  // the caller frees there afterwards is not reused under it.
  void order_after_communication() noexcept {
    if (cudaEventRecord(ready_.get(), stream_.get()) == cudaSuccess) cudaStreamWaitEvent(device_->stream(), ready_.get(), 0);
    cudaGetLastError();
  }

  cuda::device* device_;
  int rank_, size_;
  cuda::stream stream_;
  cuda::event ready_;
  float* scratch_ = nullptr;
  std::shared_ptr<pending_pool> pool_ = std::make_shared<pending_pool>();
  comm::flight_recorder recorder_;  // collective ids: the recorder's (counted also while it is off)
  supervisor<nccl_handle, pending> supervisor_;  // last: its watchdog stops first
};

}  // namespace detail

// Handle to a queued NCCL collective.
class work {
 public:
  work() = default;
  work(std::shared_ptr<detail::core> c, std::shared_ptr<detail::pending> p) : core_(std::move(c)), pending_(std::move(p)) {}
  // Orders the device's compute stream after the collective and returns at once (no host wait).
  void wait() const {
    if (pending_) core_->wait(*pending_);
  }
  // True once the collective finished on the GPU (or failed).
  bool test() const noexcept { return !pending_ || core_->test(*pending_); }
  // Throws the communicator's failure, if it has one: call it after the host synchronised with
  // the compute stream (copy_to_host) and before trusting what it read there.
  void rethrow_failure() const {
    if (core_) core_->throw_if_failed(pending_ ? pending_->name : "collective");
  }

 private:
  std::shared_ptr<detail::core> core_;
  std::shared_ptr<detail::pending> pending_;
};

class communicator {
 public:
  static constexpr device_kind memory_kind = device_kind::cuda;
  static constexpr std::string_view backend_name = "nccl";

  // Every rank calls this with the same `id` (rank 0's ncclGetUniqueId); ddp::nccl::bootstrap
  // does the exchange through a host communicator. `dev` must outlive the communicator.
  communicator(cuda::device& dev, int rank, int size, const ncclUniqueId& id, peer_channel channel = {},
               options opts = {})
      : core_(std::make_shared<detail::core>(dev, rank, size, id, std::move(channel), opts)) {}

  int rank() const noexcept { return core_->rank(); }
  int size() const noexcept { return core_->size(); }
  cuda::device& device() const noexcept { return core_->device(); }

  work all_reduce(const_buffer send, mutable_buffer recv, reduce_op op) {
    constexpr const char* name = "all_reduce";
    require(recv.count == send.count && recv.type == send.type, name, "recv must have the count and dtype of send");
    check_memory(send, recv, name);
    return submit(name, [=](ncclComm_t c, cudaStream_t s) {
      return ncclAllReduce(send.data, recv.data, send.count, datatype_of(send.type), op_of(op), c, s);
    }, send.count, send.type, op);
  }

  work broadcast(mutable_buffer buf, int root) {
    constexpr const char* name = "broadcast";
    require(root >= 0 && root < size(), name, "root " + std::to_string(root) + " is not a rank");
    check_memory(buf.data, buf.bytes(), "buffer", name);
    return submit(name, [=](ncclComm_t c, cudaStream_t s) {
      return ncclBroadcast(buf.data, buf.data, buf.count, datatype_of(buf.type), root, c, s);
    }, buf.count, buf.type, reduce_op::sum, root);
  }

  // NCCL's in-place forms are ddp's: the rank's own block of the larger buffer.
  work all_gather(const_buffer send, mutable_buffer recv) {
    constexpr const char* name = "all_gather";
    require(recv.count == send.count * static_cast<std::size_t>(size()) && recv.type == send.type, name,
            "recv must hold size() * send.count elements of send's dtype");
    check_memory(send, recv, name);
    return submit(name, [=](ncclComm_t c, cudaStream_t s) {
      return ncclAllGather(send.data, recv.data, send.count, datatype_of(send.type), c, s);
    }, send.count, send.type);
  }

  work reduce_scatter(const_buffer send, mutable_buffer recv, reduce_op op) {
    constexpr const char* name = "reduce_scatter";
    require(send.count == recv.count * static_cast<std::size_t>(size()) && recv.type == send.type, name,
            "send must hold size() * recv.count elements of recv's dtype");
    check_memory(send, recv, name);
    return submit(name, [=](ncclComm_t c, cudaStream_t s) {
      return ncclReduceScatter(send.data, recv.data, recv.count, datatype_of(send.type), op_of(op), c, s);
    }, recv.count, send.type, op);
  }

  // NCCL has no barrier: a one-float all-reduce that every rank must join serves as one.
  work barrier() {
    float* x = core_->scratch();
    return submit("barrier", [=](ncclComm_t c, cudaStream_t s) { return ncclAllReduce(x, x, 1, ncclFloat32, ncclSum, c, s); },
                  0, dtype::u8);
  }

  void abort(const std::string& reason) { core_->abort(reason); }

  // The last collectives this rank queued (comm/flight_recorder.hpp). A collective counts as
  // started when its stream reached it and completed when the watchdog saw it finish (within a
  // poll of it).
  comm::flight_recorder& recorder() noexcept { return core_->recorder(); }

  // The ranks that remain after `excluded` failed (their ranks here, in increasing order) make a
  // smaller communicator from this one, renumbered in their old order, without a new unique id:
  // ncclCommShrink. Every remaining rank calls it. After a failure it needs a communicator
  // created with options.failure_action = on_failure::revoke (an aborted one is gone); it waits
  // until NCCL has stopped this one's collectives. `channel` is the new one's way to the peers;
  // its options are this one's unless given.
  communicator shrink(const std::vector<int>& excluded, peer_channel channel = {},
                      std::optional<options> opts = std::nullopt) {
    return communicator(
        std::make_shared<detail::core>(*core_, excluded, std::move(channel), opts.value_or(core_->settings())));
  }

  // Work queued on the device's compute stream by `queue()` (a CUDA graph's launch, whose
  // collectives the watchdog cannot see one by one) watched as one collective named `name`.
  template <class Queue>
  work watch(const char* name, Queue queue) {
    return work(core_, core_->watch(name, std::move(queue)));
  }

 private:
  template <class Call>
  work submit(const char* name, Call call, std::size_t count, dtype type, reduce_op op = reduce_op::sum,
              int root = -1) {
    return work(core_, core_->enqueue(name, call, count, type, op, root));
  }

  void require(bool ok, const char* op, const std::string& what) const {
    if (!ok) throw error("nccl", op, rank(), what);
  }

  // NCCL moves memory of its own GPU only; anything else fails inside NCCL with a message
  // that names neither the buffer nor the devices.
  void check_memory(const void* p, std::size_t bytes, const char* what, const char* op) const {
    if (bytes == 0) return;
    const device_id mine = core_->device().id();
    const device_id where = core_->device().locate(p).value_or(device_id::cpu());
    if (where != mine)
      throw error("nccl", op, rank(),
                  std::string("the ") + what + " lives on " + where.to_string() +
                      " but this rank's NCCL communicator is bound to " + mine.to_string() +
                      " (pitfall P3); allocate it on the rank's ddp::cuda::device");
  }

  void check_memory(const_buffer send, mutable_buffer recv, const char* op) const {
    check_memory(send.data, send.bytes(), "send buffer", op);
    check_memory(recv.data, recv.bytes(), "recv buffer", op);
  }

  explicit communicator(std::shared_ptr<detail::core> c) : core_(std::move(c)) {}

  std::shared_ptr<detail::core> core_;
};

static_assert(diagnose_communicator<communicator>());

// Creates a NCCL communicator over the ranks of a host communicator (in-process or MPI): rank 0
// makes the unique id and the host communicator broadcasts it. Failures after this reach every
// rank through the host communicator too, which must outlive the returned one. Collective.
template <ddp::communicator Host>
communicator bootstrap(Host& host, cuda::device& dev, options opts = {}) {
  static_assert(Host::memory_kind == device_kind::cpu,
                "ddp::nccl::bootstrap needs a host communicator (ddp::inproc or ddp::mpi) to exchange the id");
  ncclUniqueId id{};
  if (host.rank() == 0) {
    try {
      check(ncclGetUniqueId(&id), "ncclGetUniqueId", host.rank());
    } catch (const std::exception& e) {
      host.abort(e.what());  // peers wait in the broadcast below
      throw;
    }
  }
  host.broadcast(mutable_buffer{&id, sizeof(id), dtype::u8}, 0).wait();
  peer_channel channel;
  channel.abort = [&host](const std::string& reason) { host.abort(reason); };
  if constexpr (requires { host.world().failure_report(); })
    channel.poll = [&host] { return host.world().failure_report(); };
  return communicator(dev, host.rank(), host.size(), id, std::move(channel), opts);
}

}  // namespace ddp::nccl
