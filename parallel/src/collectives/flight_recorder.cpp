// The flight recorder: a ring of this process's last collectives and
// messages, its dumps, and the thread that writes them on a signal, a
// request or a collective pending past its timeout.
// docs/design/parallel-collectives.md ("Flight recorder").
#include "weft/parallel/flight_recorder.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "collectives/call.h"
#include "collectives/communicator_state.h"
#include "collectives/flight.h"
#include "weft/env.h"
#include "weft/error.h"

namespace weft::parallel {
namespace detail {
namespace {

constexpr long long kMaxEntries = 1000000;
constexpr std::size_t kDefaultEntries = 2000;

enum class State : std::uint8_t { queued, started, completed, failed };
const char* to_string(State s) {
  switch (s) {
    case State::queued: return "queued";
    case State::started: return "started";
    case State::completed: return "completed";
    case State::failed: return "failed";
  }
  return "?";
}

std::int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Timestamps on the recording path: the time-stamp counter where there is
// one (a few ns, against ~23 for the system clock here), else the steady
// clock's ns; turned into µs since the epoch when read (Ticks::to_us).
std::int64_t now_ticks() noexcept {
#if defined(__x86_64__)
  return static_cast<std::int64_t>(__rdtsc());
#else
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
#endif
}

// The ticks' rate, from two readings of both clocks at least 20 ms apart:
// the recorder's start, and now (waiting the rest of the 20 ms the first time).
class Ticks {
 public:
  Ticks() : tick0_(now_ticks()), us0_(now_us()) {}
  // Ticks per µs.
  double rate() const {
    if (const double r = rate_.load(std::memory_order_relaxed); r > 0) return r;
    std::int64_t us = now_us();
    if (us - us0_ < 20000) std::this_thread::sleep_for(std::chrono::microseconds(20000 - (us - us0_)));
    const std::int64_t t = now_ticks();
    us = now_us();
    const double r = static_cast<double>(t - tick0_) / static_cast<double>(std::max<std::int64_t>(1, us - us0_));
    rate_.store(r > 0 ? r : 1.0, std::memory_order_relaxed);
    return r > 0 ? r : 1.0;
  }
  std::int64_t to_us(std::int64_t ticks) const {
    return ticks == 0 ? 0 : us0_ + static_cast<std::int64_t>(static_cast<double>(ticks - tick0_) / rate());
  }

 private:
  std::int64_t tick0_, us0_;
  mutable std::atomic<double> rate_{0};
};

// One call as a dump sees it. Fixed size: recording copies, never allocates.
struct Entry {
  std::uint64_t record = 0;  // 0: empty
  std::uint64_t comm = 0;
  std::uint64_t sequence = 0;
  std::int64_t count = 0;
  std::int64_t queued_us = 0, started_us = 0, ended_us = 0;  // ticks in a Slot, µs in a dump (0: not yet)
  std::int32_t peer = -1, root = -1;
  Kind kind{};
  State state = State::queued;
  bool has_dtype = false;
  DType dtype = DType::float32;
  char name[64] = {};
  char error[240] = {};
};

// A ring slot: two cache lines (a call touches them once when queued,
// prefetched by the call before it, and its first line twice more; a
// failure's text lives apart, in Recorder::failures_). What the call's
// start and end change is atomic, written without the ring's lock by the
// threads that start and end calls (the communication thread, an engine
// worker); the rest is written under the lock when the call is queued, and
// read under it by dumps.
struct alignas(64) Slot {
  std::atomic<std::uint64_t> record{0};
  std::atomic<std::int64_t> started{0}, ended{0};  // ticks (now_ticks); 0: not yet
  std::int64_t queued = 0;
  std::uint64_t comm = 0, sequence = 0;
  std::int64_t count = 0;
  std::int32_t peer = -1, root = -1;
  std::atomic<State> state{State::queued};
  std::atomic<bool> watched{false};  // the watchdog dumped for it already
  Kind kind{};
  bool has_dtype = false;
  DType dtype = DType::float32;
  char name[59] = {};
};
static_assert(sizeof(Slot) == 128, "a ring slot is two cache lines");

// A failed call's message (failures are rare: the last kFailures are kept).
struct Failure {
  std::uint64_t record = 0;
  char text[240] = {};
};
constexpr std::size_t kFailures = 64;

// A ring, never freed while the process lives: a start or end reported
// after the capacity changed may still index the old one (its record
// number, checked first, then matches no slot of the new one).
struct Ring {
  explicit Ring(std::size_t n) : size(n), slots(n ? std::make_unique<Slot[]>(n) : nullptr) {}
  std::size_t size;
  std::unique_ptr<Slot[]> slots;
};

void copy_text(char* dst, std::size_t capacity, std::string_view text) {
  const std::size_t n = std::min(capacity - 1, text.size());
  std::memcpy(dst, text.data(), n);
  dst[n] = '\0';
}

struct CommInfo {
  std::uint64_t id = 0;
  std::string description;
  bool across_processes = false;
  int size = 0;
  std::vector<int> local_ranks;
  std::int64_t timeout_ms = 0;  // MPI: the collectives' deadline (the watchdog's); 0: none
  Engine* engine = nullptr;     // null once the communicator is gone
};

// The ring's lock: held for a copy of one entry (or, by a dump, of the
// ring), so a spin costs less than a mutex's lock and unlock on the
// recording path (three per collective).
class RingLock {
 public:
  void lock() noexcept {
    while (held_.exchange(true, std::memory_order_acquire))
      while (held_.load(std::memory_order_relaxed)) std::this_thread::yield();
  }
  void unlock() noexcept { held_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> held_{false};
};

int g_pipe[2] = {-1, -1};  // the signal handlers' way to the recorder's thread

extern "C" void on_flight_signal(int sig) {
  const int saved = errno;
  const char c = sig == SIGTERM ? 'T' : 'U';
  if (g_pipe[1] >= 0) static_cast<void>(::write(g_pipe[1], &c, 1));
  errno = saved;
}

class Recorder {
 public:
  static Recorder& get() {
    static Recorder* r = new Recorder();  // never destroyed: its thread may run at exit
    return *r;
  }

  std::atomic<std::size_t> capacity{0};
  std::atomic<int> rank{-1};

  void set_capacity(std::size_t n) {
    {
      std::lock_guard lock(ring_mutex_);
      rings_.push_back(std::make_unique<Ring>(n));
      ring_.store(rings_.back().get(), std::memory_order_release);
      emptied_at_ = next_ - 1;  // record numbers go on (tickets taken before must not match)
      capacity.store(n, std::memory_order_relaxed);
    }
    if (n > 0) start_thread();
  }

  FlightTicket queued(CommunicatorState& state, const std::string& comm, Kind kind, const std::string& name,
                      std::uint64_t sequence, bool has_dtype, DType dtype, std::int64_t count, int peer, int root) {
    std::uint64_t id = state.flight_id.load(std::memory_order_acquire);
    if (id == 0) id = enroll(state, comm);
    const std::int64_t t = now_ticks();
    std::lock_guard lock(ring_mutex_);
    Ring& ring = *ring_.load(std::memory_order_relaxed);
    if (ring.size == 0) return {};
    const std::uint64_t record = next_++;
    Slot& s = ring.slots[record % ring.size];
    s.record.store(0, std::memory_order_relaxed);  // late updates of the slot's last call miss from here on
    s.comm = id;
    s.sequence = sequence;
    s.count = count;
    s.queued = t;
    s.peer = peer;
    s.root = root;
    s.kind = kind;
    s.has_dtype = has_dtype;
    s.dtype = dtype;
    copy_text(s.name, sizeof s.name, name);
    s.started.store(0, std::memory_order_relaxed);
    s.ended.store(0, std::memory_order_relaxed);
    s.state.store(State::queued, std::memory_order_relaxed);
    s.watched.store(false, std::memory_order_relaxed);
    s.record.store(record, std::memory_order_release);
    // The next call's slot was written ~capacity calls ago: on its way here
    // while this one runs.
    const Slot* next = &ring.slots[(record + 1) % ring.size];
    __builtin_prefetch(next, 1);
    __builtin_prefetch(reinterpret_cast<const char*>(next) + 64, 1);
    return {record};
  }

  void update(FlightTicket ticket, State state, const std::exception_ptr* error) noexcept {
    if (ticket.record == 0) return;
    const char* text = "";
    if (error && *error) {
      try {
        std::rethrow_exception(*error);
      } catch (const std::exception& x) {
        text = x.what();  // the exception object lives on in *error
      } catch (...) {
        text = "(an exception that is not a std::exception)";
      }
    }
    const std::int64_t t = now_ticks();
    Ring* ring = ring_.load(std::memory_order_acquire);
    if (ring->size == 0) return;
    Slot& s = ring->slots[ticket.record % ring->size];
    if (s.record.load(std::memory_order_acquire) != ticket.record) return;  // another ring, or overwritten since
    if (state == State::started) {
      s.started.store(t, std::memory_order_relaxed);
      State queued = State::queued;
      s.state.compare_exchange_strong(queued, State::started, std::memory_order_release);
      return;
    }
    if (*text) {  // a failure: its text under the lock (dumps read it)
      std::lock_guard lock(ring_mutex_);
      Failure& f = failures_[next_failure_++ % kFailures];
      f.record = ticket.record;
      copy_text(f.text, sizeof f.text, text);
    }
    s.ended.store(t, std::memory_order_relaxed);
    s.state.store(state, std::memory_order_release);
  }

  void forget(const CommunicatorState& state) noexcept {
    const std::uint64_t id = state.flight_id.load(std::memory_order_acquire);
    if (id == 0) return;
    std::lock_guard lock(comms_mutex_);
    comms_[id - 1].engine = nullptr;
  }

  void dump_soon(const std::string& reason) noexcept {
    if (capacity.load(std::memory_order_relaxed) == 0) return;
    {
      std::lock_guard lock(request_mutex_);
      if (auto_dumped_ || !auto_reason_.empty()) return;
      try {
        auto_reason_ = reason;
      } catch (...) {
        return;
      }
    }
    const char c = 'A';
    if (g_pipe[1] >= 0) static_cast<void>(::write(g_pipe[1], &c, 1));
  }

  std::string path() const {
    const char* dir = env::get("WEFT_FLIGHT_RECORDER_DIR");
    std::string p = dir ? std::string(dir) : std::string(".");
    if (!p.empty() && p.back() != '/') p += '/';
    const int r = rank.load(std::memory_order_relaxed);
    return p + (r >= 0 ? "weft-flight-rank" + std::to_string(r) : "weft-flight-pid" + std::to_string(::getpid())) +
           ".json";
  }

  std::string dump(std::string_view reason);
  // SIGTERM dumps only in a process of an MPI job (where mpirun sends it to
  // the survivors of a rank that died), not in every program with a
  // communicator.
  void set_rank(int r) noexcept {
    rank.store(r, std::memory_order_relaxed);
    if (capacity.load(std::memory_order_relaxed) == 0 || g_pipe[1] < 0) return;
    std::call_once(term_once_, [] { install_handler(SIGTERM); });
  }

 private:
  Recorder() {
    const long long n = env::number_or("WEFT_FLIGHT_RECORDER", static_cast<long long>(kDefaultEntries), 0, kMaxEntries,
                                       "a number of entries in [0, 1000000] (0: off)");
    rings_.push_back(std::make_unique<Ring>(static_cast<std::size_t>(n)));
    ring_.store(rings_.back().get(), std::memory_order_release);
    capacity.store(static_cast<std::size_t>(n), std::memory_order_relaxed);
    if (n > 0) start_thread();
  }

  std::uint64_t enroll(CommunicatorState& state, const std::string& comm) {
    std::lock_guard lock(comms_mutex_);
    std::uint64_t id = state.flight_id.load(std::memory_order_relaxed);
    if (id != 0) return id;
    CommInfo info;
    info.id = comms_.size() + 1;
    info.description = comm;
    info.across_processes = state.across_processes;
    info.size = state.size;
    info.local_ranks = state.local_ranks;
    info.engine = state.engine;
    if (state.across_processes) {
      try {
        info.timeout_ms = collective_timeout(state.options).count();
      } catch (...) {
        info.timeout_ms = 0;
      }
    }
    comms_.push_back(std::move(info));
    state.flight_id.store(comms_.back().id, std::memory_order_release);
    return comms_.back().id;
  }

  void start_thread() {
    std::call_once(thread_once_, [this] {
      if (::pipe(g_pipe) != 0) return;
      for (int fd : g_pipe) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
      ::fcntl(g_pipe[1], F_SETFL, O_NONBLOCK);
      install_handler(SIGUSR1);
      std::thread([this] { loop(); }).detach();
    });
  }
  // Only where nobody else handles the signal.
  static void install_handler(int sig) noexcept {
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) != 0 || old.sa_handler != SIG_DFL) return;
    struct sigaction sa {};
    sa.sa_handler = on_flight_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    ::sigaction(sig, &sa, nullptr);
  }

  void loop();
  // Entries of MPI communicators pending longer than their timeout, not yet
  // dumped for: the oldest one's text (empty: none).
  std::string overdue();

  RingLock ring_mutex_;
  std::atomic<Ring*> ring_{nullptr};
  std::vector<std::unique_ptr<Ring>> rings_;  // every ring made (under the lock)
  std::uint64_t next_ = 1;
  std::uint64_t emptied_at_ = 0;
  Failure failures_[kFailures];  // under the lock
  std::uint64_t next_failure_ = 0;  // the last record number before the ring was last emptied
  std::mutex comms_mutex_;
  std::vector<CommInfo> comms_;  // by id - 1
  std::once_flag thread_once_;
  std::once_flag term_once_;
  std::mutex request_mutex_;
  std::string auto_reason_;
  bool auto_dumped_ = false;
  std::mutex dump_mutex_;  // one dump at a time
  Ticks ticks_;            // entries' times are ticks (now_ticks)
};

std::string Recorder::overdue() {
  std::map<std::uint64_t, std::int64_t> timeouts;
  {
    std::lock_guard lock(comms_mutex_);
    for (const CommInfo& c : comms_)
      if (c.timeout_ms > 0) timeouts[c.id] = c.timeout_ms;
  }
  if (timeouts.empty()) return {};
  const double per_us = ticks_.rate();
  const std::int64_t t = now_ticks();
  std::lock_guard lock(ring_mutex_);
  const Ring& ring = *ring_.load(std::memory_order_relaxed);
  const Slot* oldest = nullptr;
  for (std::size_t i = 0; i < ring.size; ++i) {
    Slot& s = ring.slots[i];
    const std::uint64_t record = s.record.load(std::memory_order_acquire);
    const State state = s.state.load(std::memory_order_acquire);
    if (record == 0 || s.watched.load(std::memory_order_relaxed) || (state != State::queued && state != State::started))
      continue;
    auto it = timeouts.find(s.comm);
    if (it == timeouts.end()) continue;
    const std::int64_t since = state == State::started ? s.started.load(std::memory_order_relaxed) : s.queued;
    if (static_cast<double>(t - since) < static_cast<double>(it->second) * 1000.0 * per_us) continue;
    s.watched.store(true, std::memory_order_relaxed);
    if (!oldest || record < oldest->record.load(std::memory_order_relaxed)) oldest = &s;
  }
  if (!oldest) return {};
  return std::string(detail::to_string(oldest->kind)) + " '" + oldest->name + "' #" +
         std::to_string(oldest->sequence) + " of communicator " + std::to_string(oldest->comm) + " " +
         to_string(oldest->state.load(std::memory_order_relaxed)) + " for longer than its timeout";
}

void Recorder::loop() {
  for (;;) {
    pollfd p{g_pipe[0], POLLIN, 0};
    const int n = ::poll(&p, 1, 250);
    std::string reason;
    bool term = false, forced = false;
    if (n > 0 && (p.revents & POLLIN)) {
      char buf[64];
      const ssize_t got = ::read(g_pipe[0], buf, sizeof buf);
      for (ssize_t i = 0; i < got; ++i) {
        if (buf[i] == 'T') term = true;
        if (buf[i] == 'U') forced = true;
      }
    }
    if (capacity.load(std::memory_order_relaxed) == 0 && !term) continue;
    if (term) {
      reason = "SIGTERM";
      forced = true;
    } else if (forced) {
      reason = "SIGUSR1";
    } else {
      std::lock_guard lock(request_mutex_);
      if (!auto_reason_.empty() && !auto_dumped_) reason = auto_reason_;
    }
    if (reason.empty()) {
      std::string late;
      try {
        late = overdue();
      } catch (...) {
      }
      if (!late.empty()) {
        std::lock_guard lock(request_mutex_);
        if (!auto_dumped_) reason = late;
      }
    }
    if (!reason.empty()) {
      if (!forced) {
        std::lock_guard lock(request_mutex_);
        auto_dumped_ = true;
      }
      try {
        const std::string written = dump(reason);
        if (!written.empty()) std::fprintf(stderr, "weft: flight record (%s) written to %s\n", reason.c_str(), written.c_str());
      } catch (const std::exception& x) {
        std::fprintf(stderr, "weft: flight record (%s) not written: %s\n", reason.c_str(), x.what());
      }
    }
    if (term) {
      // Die of it, as without the recorder.
      ::signal(SIGTERM, SIG_DFL);
      ::raise(SIGTERM);
    }
  }
}

void json_string(std::string& out, std::string_view s) {
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

std::string Recorder::dump(std::string_view reason) {
  if (capacity.load(std::memory_order_relaxed) == 0) return {};
  std::lock_guard dump_lock(dump_mutex_);
  std::vector<Entry> entries;
  std::size_t cap = 0;
  std::uint64_t recorded = 0;
  {
    std::lock_guard lock(ring_mutex_);
    const Ring& ring = *ring_.load(std::memory_order_relaxed);
    cap = ring.size;
    recorded = next_ - 1 - emptied_at_;
    for (std::size_t i = 0; i < ring.size; ++i) {
      const Slot& s = ring.slots[i];
      Entry e;
      e.record = s.record.load(std::memory_order_acquire);
      if (e.record == 0) continue;
      e.state = s.state.load(std::memory_order_acquire);
      e.started_us = s.started.load(std::memory_order_relaxed);
      e.ended_us = s.ended.load(std::memory_order_relaxed);
      e.queued_us = s.queued;
      e.comm = s.comm;
      e.sequence = s.sequence;
      e.count = s.count;
      e.peer = s.peer;
      e.root = s.root;
      e.kind = s.kind;
      e.has_dtype = s.has_dtype;
      e.dtype = s.dtype;
      std::memcpy(e.name, s.name, sizeof s.name);
      if (e.state == State::failed) {
        copy_text(e.error, sizeof e.error, "(its message was overwritten by later failures)");
        for (const Failure& f : failures_)
          if (f.record == e.record) copy_text(e.error, sizeof e.error, f.text);
      }
      entries.push_back(e);  // in ticks until the lock is let go
    }
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.record < b.record; });
  for (Entry& e : entries) {
    e.queued_us = ticks_.to_us(e.queued_us);
    e.started_us = ticks_.to_us(e.started_us);
    e.ended_us = ticks_.to_us(e.ended_us);
  }
  std::vector<CommInfo> comms;
  std::vector<Engine*> engines;
  std::vector<std::vector<PendingOp>> pending;
  {
    // Held while the engines answer: a communicator (and, by contract, its
    // engine) cannot go meanwhile (flight_forget waits).
    std::lock_guard lock(comms_mutex_);
    comms = comms_;
    for (const CommInfo& c : comms_)
      if (c.engine && std::find(engines.begin(), engines.end(), c.engine) == engines.end()) engines.push_back(c.engine);
    for (Engine* e : engines) pending.push_back(e->pending_ops());
  }
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);

  std::string out;
  out.reserve(256 + entries.size() * 256);
  out += "{\n\"format\": \"weft-flight-record\",\n\"version\": 1,\n\"rank\": ";
  out += std::to_string(rank.load(std::memory_order_relaxed));
  out += ",\n\"host\": ";
  json_string(out, host);
  out += ",\n\"pid\": " + std::to_string(::getpid()) + ",\n\"reason\": ";
  json_string(out, reason);
  out += ",\n\"time_us\": " + std::to_string(now_us()) + ",\n\"capacity\": " + std::to_string(cap) +
         ",\n\"recorded\": " + std::to_string(recorded) + ",\n\"communicators\": [";
  for (std::size_t i = 0; i < comms.size(); ++i) {
    const CommInfo& c = comms[i];
    out += i ? ",\n  " : "\n  ";
    out += "{\"id\": " + std::to_string(c.id) + ", \"description\": ";
    json_string(out, c.description);
    out += ", \"across_processes\": ";
    out += c.across_processes ? "true" : "false";
    out += ", \"size\": " + std::to_string(c.size) + ", \"local_ranks\": [";
    for (std::size_t k = 0; k < c.local_ranks.size(); ++k) out += (k ? ", " : "") + std::to_string(c.local_ranks[k]);
    out += "], \"timeout_ms\": " + std::to_string(c.timeout_ms) + ", \"engine\": ";
    const auto at = std::find(engines.begin(), engines.end(), c.engine);
    out += at == engines.end() ? std::string("null") : std::to_string(at - engines.begin());
    out += "}";
  }
  out += "\n],\n\"entries\": [";
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    out += i ? ",\n  " : "\n  ";
    out += "{\"record\": " + std::to_string(e.record) + ", \"comm\": " + std::to_string(e.comm) +
           ", \"seq\": " + std::to_string(e.sequence) + ", \"kind\": \"" + detail::to_string(e.kind) + "\", \"name\": ";
    json_string(out, e.name);
    out += ", \"dtype\": ";
    if (e.has_dtype)
      json_string(out, weft::to_string(e.dtype));
    else
      out += "null";
    out += ", \"count\": " + std::to_string(e.count) + ", \"peer\": " + std::to_string(e.peer) +
           ", \"root\": " + std::to_string(e.root) + ", \"state\": \"" + to_string(e.state) + "\"";
    if (e.state == State::failed) {
      out += ", \"error\": ";
      json_string(out, e.error);
    }
    out += ", \"queued_us\": " + std::to_string(e.queued_us);
    if (e.started_us) out += ", \"started_us\": " + std::to_string(e.started_us);
    if (e.ended_us) out += ", \"ended_us\": " + std::to_string(e.ended_us);
    out += "}";
  }
  out += "\n],\n\"pending_ops\": [";
  bool first = true;
  for (std::size_t g = 0; g < pending.size(); ++g)
    for (const PendingOp& op : pending[g]) {
      out += first ? "\n  " : ",\n  ";
      first = false;
      out += "{\"engine\": " + std::to_string(g) + ", \"id\": " + std::to_string(op.id) + ", \"name\": ";
      json_string(out, op.name);
      out += ", \"device\": ";
      json_string(out, op.device.str());
      out += std::string(", \"state\": \"") + (op.running ? "running" : "waiting") + "\", \"waits\": [";
      for (std::size_t w = 0; w < op.waits.size(); ++w) {
        const PendingOp::Wait& x = op.waits[w];
        out += w ? ", " : "";
        out += "{\"var\": " + std::to_string(x.var) + ", \"var_name\": ";
        json_string(out, x.var_name);
        out += std::string(", \"access\": \"") + (x.write ? "write" : "read") + "\"";
        if (x.holder) {
          out += ", \"holder\": " + std::to_string(x.holder) + ", \"holder_name\": ";
          json_string(out, x.holder_name);
          out += std::string(", \"holder_state\": \"") + (x.holder_running ? "running" : "waiting") + "\"";
        }
        if (x.behind) out += ", \"behind\": " + std::to_string(x.behind);
        out += "}";
      }
      out += "]}";
    }
  out += "\n]\n}\n";

  const std::string file = path();
  const std::string tmp = file + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) throw Error("weft: the flight record " + file + " cannot be written: " + std::strerror(errno));
  const bool ok = std::fwrite(out.data(), 1, out.size(), f) == out.size();
  const bool closed = std::fclose(f) == 0;
  if (!ok || !closed || std::rename(tmp.c_str(), file.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    throw Error("weft: the flight record " + file + " cannot be written: " + std::strerror(err));
  }
  return file;
}

}  // namespace

bool flight_recording() { return Recorder::get().capacity.load(std::memory_order_relaxed) > 0; }

FlightTicket flight_queued(CommunicatorState& state, const std::string& comm, Kind kind, const std::string& name,
                           std::uint64_t sequence, bool has_dtype, DType dtype, std::int64_t count, int peer, int root) {
  return Recorder::get().queued(state, comm, kind, name, sequence, has_dtype, dtype, count, peer, root);
}

void flight_started(FlightTicket ticket) noexcept { Recorder::get().update(ticket, State::started, nullptr); }

void flight_completed(FlightTicket ticket, const std::exception_ptr& error) noexcept {
  Recorder::get().update(ticket, error ? State::failed : State::completed, &error);
}

void flight_forget(const CommunicatorState& state) noexcept { Recorder::get().forget(state); }

void flight_set_rank(int rank) noexcept { Recorder::get().set_rank(rank); }

void flight_dump_soon(const std::string& reason) noexcept { Recorder::get().dump_soon(reason); }

}  // namespace detail

std::size_t flight_recorder_capacity() { return detail::Recorder::get().capacity.load(std::memory_order_relaxed); }

void set_flight_recorder_capacity(std::size_t entries) {
  if (entries > static_cast<std::size_t>(detail::kMaxEntries))
    throw InvalidArgument("weft::parallel::set_flight_recorder_capacity: " + std::to_string(entries) +
                          " entries is more than " + std::to_string(detail::kMaxEntries));
  detail::Recorder::get().set_capacity(entries);
}

std::string dump_flight_record(std::string_view reason) { return detail::Recorder::get().dump(reason); }

std::string flight_record_path() { return detail::Recorder::get().path(); }

}  // namespace weft::parallel
