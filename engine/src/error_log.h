// Failures travel as shared ErrorRecords: a failed op stores its record on the
// variables it writes, and ops skipped because they read a failed variable pass
// the same record on. Reporting a record (by wait_to_read on any variable that
// carries it, or by wait_all) marks it reported, which clears it from every
// variable at once: each failure is thrown once.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace weft::detail {

// Reporting is ordered by push sequence, like everything else: a failure
// reported by a wait still reaches ops pushed before that wait (whenever they
// run), and no op pushed after it.
struct ErrorRecord {
  static constexpr std::uint64_t kUnreported = ~std::uint64_t{0};

  std::exception_ptr error;
  std::string op_name;
  std::atomic<std::uint64_t> reported_at{kUnreported};  // first op id pushed after the report

  // True the first time only: the caller then rethrows. `next_op_id` is the
  // id the next pushed op will get.
  bool claim(std::uint64_t next_op_id) noexcept {
    std::uint64_t expected = kUnreported;
    return reported_at.compare_exchange_strong(expected, next_op_id, std::memory_order_acq_rel);
  }
  bool pending() const noexcept { return reported_at.load(std::memory_order_acquire) == kUnreported; }
  // Whether the op with this push id inherits the failure.
  bool reaches(std::uint64_t op_id) const noexcept { return op_id < reported_at.load(std::memory_order_acquire); }
};
using ErrorRef = std::shared_ptr<ErrorRecord>;

class ErrorLog {
 public:
  ErrorRef add(std::exception_ptr error, std::string op_name);
  // Marks every record reported and forgets them; rethrows the first one that
  // was not reported before.
  void report_all(std::uint64_t next_op_id);
  // Count of records not yet reported (for the exit warning).
  std::size_t pending() const;
  // False when no failure can reach the op with this id: lets ops skip
  // looking at their variables (two loads of rarely written lines).
  bool may_reach(std::uint64_t op_id) const noexcept {
    return held_.load(std::memory_order_acquire) != 0 || op_id < forgotten_before_.load(std::memory_order_acquire);
  }
  std::string first_pending_message() const;

 private:
  mutable std::mutex mutex_;
  std::vector<ErrorRef> records_;
  std::atomic<std::size_t> held_{0};                // records_.size()
  std::atomic<std::uint64_t> forgotten_before_{0};  // report_all's next op id: older ops may still inherit
};

std::string describe_exception(const std::exception_ptr& error);

}  // namespace weft::detail
