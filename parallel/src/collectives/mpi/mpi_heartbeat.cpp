// The heartbeat of an MPI job (mpi_heartbeat.h; docs/design/parallel-collectives.md,
// "Heartbeats").
#include "collectives/mpi/mpi_heartbeat.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "collectives/mpi/mpi_group.h"
#include "weft/env.h"

namespace weft::parallel::detail {
namespace {

using std::chrono::milliseconds;

// On the heartbeat's communicator (a duplicate of MPI_COMM_WORLD of its
// own): beats to and from the ring neighbours, and notices of a death from
// any rank.
constexpr int kBeatTag = 0, kNoticeTag = 1;
// A beat with this count says goodbye: the rank is exiting normally, and
// its silence from then on is no death.
constexpr std::uint64_t kGoodbye = ~std::uint64_t{0};
// How often notices are looked for between beats.
constexpr std::chrono::milliseconds kNoticePoll{20};

// What every rank says about itself at start.
struct Hello {
  char host[64] = {};
  std::int64_t interval_ms = 0, timeout_ms = 0;  // 0: the heartbeat is off on that rank
};
static_assert(std::is_trivially_copyable_v<Hello>);

// A rank declared dead, sent by the rank that noticed to every other.
struct Notice {
  std::int32_t rank = -1;
  std::int32_t noticed_by = -1;
  std::int64_t silent_ms = 0;
};
static_assert(std::is_trivially_copyable_v<Notice>);

// Process-wide state shared with other threads (never destroyed: at exit
// fibers and destructors of communicators may still look).
struct Registry {
  std::mutex mutex;
  std::vector<MpiGroup*> groups;
  std::vector<DeathHook> hooks;
  std::map<int, std::string> dead;  // world rank -> what the failed collectives say
  std::string self_dead;            // this rank was declared dead by the others: why
  std::vector<std::string> hosts;   // by world rank, once exchanged
  bool started = false;             // comm thread only
  std::atomic<bool> any{false};
};
Registry& registry() {
  static auto* r = new Registry();
  return *r;
}

std::string seconds_tenths(milliseconds t) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", static_cast<double>(t.count()) / 1000.0);
  return text;
}

std::string host_of(const Registry& r, int rank) {
  return rank >= 0 && static_cast<std::size_t>(rank) < r.hosts.size() ? r.hosts[static_cast<std::size_t>(rank)]
                                                                      : std::string("unknown");
}

// The group rank of world rank `w` in g, or -1.
int member_rank(const MpiGroup& g, int w) {
  const auto it = std::find(g.world_ranks.begin(), g.world_ranks.end(), w);
  return it == g.world_ranks.end() ? -1 : static_cast<int>(it - g.world_ranks.begin());
}

// Fails g (comm thread; under the registry's mutex): its waits end at once
// (MpiGroup::lost) and every failure on it says `why`.
void lose(MpiGroup& g, const std::string& why, int peer) {
  if (g.lost) return;
  g.lost_why = why;
  if (peer >= 0 && g.world_ranks.size() > 1 && peer != g.world_ranks[static_cast<std::size_t>(peer)])
    g.lost_why += " (rank " + std::to_string(peer) + " of this communicator)";
  g.lost_peer = peer;
  g.lost = true;
  g.set_broken(g.lost_why);
}

// A rank declared dead (comm thread): every communicator with it fails,
// then the hooks run. `self`: this rank, declared dead by the others.
void declare(const RankDeath& death, bool self) {
  // The flight recorder's dump says it first: the collectives failing below
  // would each ask for one with less to say (only the first is written).
  flight_dump_soon("heartbeat: " + death.message);
  Registry& r = registry();
  std::vector<DeathHook> hooks;
  {
    std::lock_guard lock(r.mutex);
    if (self) {
      if (!r.self_dead.empty()) return;
      r.self_dead = death.message;
      for (MpiGroup* g : r.groups) lose(*g, death.message, CommunicationError::kNoPeer);
    } else {
      if (!r.dead.emplace(death.rank, death.message).second) return;
      for (MpiGroup* g : r.groups)
        if (const int peer = member_rank(*g, death.rank); peer >= 0) lose(*g, death.message, peer);
    }
    r.any.store(true, std::memory_order_release);
    hooks = r.hooks;
  }
  // The one line a job's log shows even where no collective was pending.
  std::fprintf(stderr, "weft: heartbeat: %s\n", death.message.c_str());
  // ---- the call site of in-process reports of a declared death (on_rank_death) ----
  for (const DeathHook& hook : hooks) {
    try {
      hook(death);
    } catch (...) {
    }
  }
}

RankDeath death_of(int rank, milliseconds silent, int noticed_by, const HeartbeatSettings& s) {
  const Registry& r = registry();
  RankDeath d;
  d.rank = rank;
  d.host = host_of(r, rank);
  d.silent = silent;
  d.noticed_by = noticed_by;
  d.message = "rank " + std::to_string(rank) + " (host " + d.host + ") has been silent for " +
              seconds_tenths(silent) + ": declared dead by the heartbeat of rank " + std::to_string(noticed_by) +
              " (host " + host_of(r, noticed_by) + "; WEFT_HEARTBEAT_TIMEOUT " + seconds_text(s.timeout) + ")";
  return d;
}

// The heartbeat's fiber and what it keeps (on the heap: at exit, requests
// still pending are left to MPI with their buffers).
struct Beating {
  MPI_Comm comm = MPI_COMM_NULL;
  int me = 0, n = 1;
  HeartbeatSettings settings;
  struct Neighbour {
    int rank = -1;
    std::uint64_t in = 0, out = 0;  // the beat being received, the one being sent
    MPI_Request recv = MPI_REQUEST_NULL, send = MPI_REQUEST_NULL;
    Clock::time_point heard;  // the last beat's arrival, as this rank saw it
    milliseconds silent{0};   // of this rank's own running time since then
    bool watched = true;      // false once it said goodbye or was declared dead
  };
  std::vector<Neighbour> neighbours;
  Notice notice_in;
  MPI_Request notice_recv = MPI_REQUEST_NULL;
  std::vector<std::unique_ptr<Notice>> notices_out;  // sent, with their requests
  std::vector<MPI_Request> notice_sends;
  std::uint64_t beats = 0;
  bool broken = false;  // an MPI call failed: the heartbeat stops (said once on stderr)
  // MPI_Finalize called by the application (finalizing, MPI_COMM_SELF's
  // attribute callback): the fiber says goodbye and ends (finished).
  std::atomic<bool> finalizing{false}, finished{false};

  bool check(int rc, const char* call) {
    if (rc == MPI_SUCCESS) return true;
    if (!broken)
      std::fprintf(stderr, "weft: heartbeat of rank %d stops: %s\n", me, WEFT_MPI_FAILURE(call, rc).c_str());
    broken = true;
    return false;
  }

  void unwatch(Neighbour& nb) {
    nb.watched = false;
    if (nb.recv != MPI_REQUEST_NULL) {
      MPI_Cancel(&nb.recv);
      MPI_Wait(&nb.recv, MPI_STATUS_IGNORE);
    }
  }

  // Every beat that arrived; true when at least one did.
  bool drain(Neighbour& nb) {
    bool heard = false;
    while (nb.watched && !broken) {
      int flag = 0;
      if (!check(MPI_Test(&nb.recv, &flag, MPI_STATUS_IGNORE), "MPI_Test") || !flag) break;
      if (nb.in == kGoodbye) {
        nb.watched = false;  // its receive is complete: nothing to cancel
        break;
      }
      heard = true;
      check(MPI_Irecv(&nb.in, 1, MPI_UINT64_T, nb.rank, kBeatTag, comm, &nb.recv), "MPI_Irecv");
    }
    return heard;
  }

  void beat(Neighbour& nb, std::uint64_t count) {
    if (nb.send != MPI_REQUEST_NULL) {
      int flag = 0;
      if (!check(MPI_Test(&nb.send, &flag, MPI_STATUS_IGNORE), "MPI_Test") || !flag) return;  // it is not taking them
    }
    nb.out = count;
    check(MPI_Isend(&nb.out, 1, MPI_UINT64_T, nb.rank, kBeatTag, comm, &nb.send), "MPI_Isend");
  }

  void tell_everyone(const RankDeath& d) {
    auto notice = std::make_unique<Notice>();
    notice->rank = d.rank;
    notice->noticed_by = me;
    notice->silent_ms = d.silent.count();
    const std::map<int, std::string> dead = [] {
      std::lock_guard lock(registry().mutex);
      return registry().dead;
    }();
    for (int r = 0; r < n; ++r) {
      if (r == me || dead.count(r)) continue;
      notice_sends.push_back(MPI_REQUEST_NULL);
      if (!check(MPI_Isend(notice.get(), sizeof(Notice), MPI_BYTE, r, kNoticeTag, comm, &notice_sends.back()),
                 "MPI_Isend"))
        return;
    }
    notices_out.push_back(std::move(notice));
  }

  void hear_notices() {
    while (!broken) {
      int flag = 0;
      if (!check(MPI_Test(&notice_recv, &flag, MPI_STATUS_IGNORE), "MPI_Test") || !flag) return;
      const Notice got = notice_in;
      check(MPI_Irecv(&notice_in, sizeof(Notice), MPI_BYTE, MPI_ANY_SOURCE, kNoticeTag, comm, &notice_recv),
            "MPI_Irecv");
      if (got.rank == me) {
        RankDeath d = death_of(me, milliseconds(got.silent_ms), got.noticed_by, settings);
        d.message = "this rank (" + std::to_string(me) + ", host " + d.host + ") was declared dead by the heartbeat of rank " +
                    std::to_string(got.noticed_by) + " (host " + host_of(registry(), got.noticed_by) +
                    ") after " + seconds_tenths(d.silent) + " of silence (it was stopped, or starved of CPU)";
        declare(d, /*self=*/true);
        continue;
      }
      for (Neighbour& nb : neighbours)
        if (nb.rank == got.rank && nb.watched) unwatch(nb);
      declare(death_of(got.rank, milliseconds(got.silent_ms), got.noticed_by, settings), false);
    }
  }

  void run(CommThread& thread) {
    struct Finished {
      std::atomic<bool>& flag;
      ~Finished() { flag.store(true, std::memory_order_release); }
    } finished_at_end{finished};
    for (Neighbour& nb : neighbours) {
      nb.heard = Clock::now();
      if (!check(MPI_Irecv(&nb.in, 1, MPI_UINT64_T, nb.rank, kBeatTag, comm, &nb.recv), "MPI_Irecv")) return;
    }
    if (!check(MPI_Irecv(&notice_in, sizeof(Notice), MPI_BYTE, MPI_ANY_SOURCE, kNoticeTag, comm, &notice_recv),
               "MPI_Irecv"))
      return;
    const auto interval = settings.interval;
    Clock::time_point last = Clock::now();
    while (!broken) {
      // Waits quietly: between beats the thread sleeps unless collectives
      // poll. Notices are looked for more often than beats go (every
      // kNoticePoll), so that every survivor learns of a death within
      // moments of the rank that noticed it.
      const Clock::time_point next = last + interval;
      const auto waited = thread.wait_woken([this] { return finalizing.load(std::memory_order_acquire); },
                                            std::min(next, Clock::now() + kNoticePoll));
      if (waited == CommThread::Wait::stopping || finalizing.load(std::memory_order_acquire)) break;
      hear_notices();
      if (Clock::now() < next) continue;
      const Clock::time_point now = Clock::now();
      // The silence charged to a neighbour is this rank's own running time:
      // a step much longer than the interval means this process (or its
      // communication thread) did not run, and counts as two intervals.
      const auto step = std::min(std::chrono::duration_cast<milliseconds>(now - last), 2 * interval);
      last = now;
      ++beats;
      for (Neighbour& nb : neighbours) {
        if (!nb.watched) continue;
        beat(nb, beats);
        if (drain(nb)) {
          nb.heard = now;
          nb.silent = milliseconds(0);
          continue;
        }
        if (!nb.watched) continue;  // it said goodbye
        nb.silent += step;
        if (nb.silent < settings.timeout) continue;
        const RankDeath d =
            death_of(nb.rank, std::chrono::duration_cast<milliseconds>(now - nb.heard), me, settings);
        unwatch(nb);
        declare(d, false);
        tell_everyone(d);
      }
      for (MPI_Request& q : notice_sends) {
        int flag = 0;
        if (q != MPI_REQUEST_NULL) MPI_Test(&q, &flag, MPI_STATUS_IGNORE);
      }
    }
    if (broken) return;
    // Exiting normally: goodbye to the neighbours, so that they do not take
    // the silence that follows for a death (bounded: a stopped neighbour
    // may never take it).
    for (Neighbour& nb : neighbours) {
      if (!nb.watched || nb.rank < 0) continue;
      if (nb.send != MPI_REQUEST_NULL) MPI_Request_free(&nb.send);
      nb.out = kGoodbye;
      MPI_Isend(&nb.out, 1, MPI_UINT64_T, nb.rank, kBeatTag, comm, &nb.send);
    }
    const Clock::time_point until = Clock::now() + milliseconds(200);
    for (Neighbour& nb : neighbours) {
      while (nb.send != MPI_REQUEST_NULL && Clock::now() < until) {
        int flag = 0;
        if (MPI_Test(&nb.send, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
        if (!flag) std::this_thread::yield();
      }
      if (nb.send != MPI_REQUEST_NULL) MPI_Request_free(&nb.send);
      if (nb.recv != MPI_REQUEST_NULL) {  // nothing pending is left to MPI_Finalize
        MPI_Cancel(&nb.recv);
        MPI_Wait(&nb.recv, MPI_STATUS_IGNORE);
      }
    }
    if (notice_recv != MPI_REQUEST_NULL) {
      MPI_Cancel(&notice_recv);
      MPI_Wait(&notice_recv, MPI_STATUS_IGNORE);
    }
  }
};

std::atomic<Beating*> the_beating{nullptr};

// MPI_Finalize deletes MPI_COMM_SELF's attributes first: where the
// application finalizes MPI itself while the communication thread still
// runs, the heartbeat ends here, before MPI does (it would call MPI_Test
// after MPI_Finalize otherwise). Bounded: a thread that never answers is
// not waited for.
int stop_before_finalize(MPI_Comm, int, void*, void*) {
  Beating* b = the_beating.load(std::memory_order_acquire);
  if (!b || b->finished.load(std::memory_order_acquire)) return MPI_SUCCESS;
  b->finalizing.store(true, std::memory_order_release);
  CommThread& thread = MpiProcess::get().thread();
  thread.wake();
  const Clock::time_point until = Clock::now() + std::chrono::seconds(2);
  while (!b->finished.load(std::memory_order_acquire) && Clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return MPI_SUCCESS;
}

}  // namespace

HeartbeatSettings heartbeat_settings() {
  HeartbeatSettings s;
  const char* interval = env::get("WEFT_HEARTBEAT_INTERVAL");
  if (interval && std::string(interval) == "off") {
    s.on = false;
    return s;
  }
  const double every = env::real_if("WEFT_HEARTBEAT_INTERVAL", 1.0, [](double v) { return v >= 0.001 && v <= 3600; },
                                    "a number of seconds in [0.001, 3600], such as 1 or 0.25, or off");
  s.interval = milliseconds(static_cast<long long>(every * 1000 + 0.5));
  const double ms = static_cast<double>(s.interval.count());
  const double timeout = env::real_if(
      "WEFT_HEARTBEAT_TIMEOUT", std::max(10.0, 2 * ms / 1000), [ms](double v) { return v * 1000 >= 2 * ms && v <= 1e7; },
      "a number of seconds at least twice WEFT_HEARTBEAT_INTERVAL (" + seconds_text(s.interval) +
          "), such as 10");
  s.timeout = milliseconds(static_cast<long long>(timeout * 1000 + 0.5));
  return s;
}

std::string start_heartbeat(CommThread& thread, const HeartbeatSettings& settings, Clock::time_point deadline) {
  Registry& reg = registry();
  if (reg.started) return "";
  reg.started = true;
  MpiProcess& process = MpiProcess::get();
  // On the heap: a rank that never joins leaves these to MPI.
  struct Pending {
    MPI_Comm comm = MPI_COMM_NULL;
    MPI_Request request = MPI_REQUEST_NULL;
    Hello mine;
    std::vector<Hello> all;
  };
  auto p = std::make_unique<Pending>();
  if (gethostname(p->mine.host, sizeof p->mine.host - 1) != 0) copy_text(p->mine.host, sizeof p->mine.host, "unknown");
  p->mine.host[sizeof p->mine.host - 1] = '\0';
  if (settings.on) {
    p->mine.interval_ms = settings.interval.count();
    p->mine.timeout_ms = settings.timeout.count();
  }
  p->all.assign(static_cast<std::size_t>(process.size()), Hello{});
  // Every rank makes this communicator and exchanges its hello, with the
  // heartbeat on or off, so that the collective calls match.
  int rc = MPI_Comm_idup(MPI_COMM_WORLD, &p->comm, &p->request);
  if (rc != MPI_SUCCESS) return "starting the heartbeat: " + WEFT_MPI_FAILURE("MPI_Comm_idup", rc);
  for (int step = 0; step < 2; ++step) {
    if (step == 1) {
      MPI_Comm_set_errhandler(p->comm, MPI_ERRORS_RETURN);
      rc = MPI_Iallgather(&p->mine, sizeof(Hello), MPI_BYTE, p->all.data(), sizeof(Hello), MPI_BYTE, p->comm,
                          &p->request);
      if (rc != MPI_SUCCESS) return "starting the heartbeat: " + WEFT_MPI_FAILURE("MPI_Iallgather", rc);
    }
    int tested = MPI_SUCCESS;
    const auto waited = thread.poll_until([&] { return test_all({&p->request}, tested); }, deadline);
    if (tested != MPI_SUCCESS || waited != CommThread::Wait::done) {
      static_cast<void>(p.release());
      return tested != MPI_SUCCESS ? "starting the heartbeat: " + WEFT_MPI_FAILURE("MPI_Test", tested)
             : waited == CommThread::Wait::stopping
                 ? std::string("the process is exiting")
                 : "not every rank created its first communicator within the collective timeout";
    }
  }
  std::int64_t interval = 0, timeout = 0;
  bool on = true;
  {
    std::lock_guard lock(reg.mutex);
    for (const Hello& h : p->all) {
      reg.hosts.emplace_back(h.host, strnlen(h.host, sizeof h.host));
      on = on && h.interval_ms > 0;
      interval = std::max(interval, h.interval_ms);
      timeout = std::max(timeout, h.timeout_ms);
    }
  }
  // Off on any rank: off everywhere (a rank that does not beat would be
  // declared dead). On: every rank uses the longest interval and timeout
  // of all, so that no rank judges a neighbour that beats more slowly.
  if (!on || process.size() < 2) return "";
  auto b = std::make_unique<Beating>();
  b->comm = p->comm;
  b->me = process.rank();
  b->n = process.size();
  b->settings = {true, milliseconds(interval), milliseconds(timeout)};
  for (const int r : {(b->me + 1) % b->n, (b->me + b->n - 1) % b->n}) {
    if (std::any_of(b->neighbours.begin(), b->neighbours.end(), [r](const auto& nb) { return nb.rank == r; })) continue;
    b->neighbours.emplace_back().rank = r;
  }
  Beating* beating = b.release();  // never deleted: at exit its requests may still be pending
  the_beating.store(beating, std::memory_order_release);
  int key = MPI_KEYVAL_INVALID;
  if (MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, stop_before_finalize, &key, nullptr) == MPI_SUCCESS)
    MPI_Comm_set_attr(MPI_COMM_SELF, key, nullptr);
  if (!thread.spawn([beating, &thread] { beating->run(thread); })) {
    beating->finished.store(true, std::memory_order_release);
    return "the process is exiting";
  }
  return "";
}

void watch_group(MpiGroup& g) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.groups.push_back(&g);
  if (!r.self_dead.empty()) return lose(g, r.self_dead, CommunicationError::kNoPeer);
  for (const auto& [rank, why] : r.dead)
    if (const int peer = member_rank(g, rank); peer >= 0) return lose(g, why, peer);
}

void unwatch_group(MpiGroup* g) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  std::erase(r.groups, g);
}

std::string declared_deaths() {
  Registry& r = registry();
  if (!r.any.load(std::memory_order_acquire)) return "";
  std::lock_guard lock(r.mutex);
  if (!r.self_dead.empty()) return r.self_dead;
  return r.dead.empty() ? std::string() : r.dead.begin()->second;
}

void on_rank_death(DeathHook hook) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.hooks.push_back(std::move(hook));
}

bool death_declared() noexcept { return registry().any.load(std::memory_order_acquire); }

}  // namespace weft::parallel::detail
