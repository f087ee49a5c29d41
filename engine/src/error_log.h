// Failures travel as shared ErrorRecords: a failed op stores its record on the
// variables it writes, and ops skipped because they read a failed variable pass
// the same record on. Reporting a record (by wait_to_read on any variable that
// carries it, or by wait_all) marks it reported, which clears it from every
// variable at once: each failure is thrown once.
#pragma once

#include <atomic>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace weft::detail {

struct ErrorRecord {
  std::exception_ptr error;
  std::string op_name;
  std::atomic<bool> reported{false};

  // True the first time only: the caller then rethrows.
  bool claim() noexcept { return !reported.exchange(true, std::memory_order_acq_rel); }
  bool pending() const noexcept { return !reported.load(std::memory_order_acquire); }
};
using ErrorRef = std::shared_ptr<ErrorRecord>;

class ErrorLog {
 public:
  ErrorRef add(std::exception_ptr error, std::string op_name);
  // Marks every record reported and forgets them; rethrows the first one that
  // was not reported before.
  void report_all();
  // Count of records not yet reported (for the exit warning).
  std::size_t pending() const;
  // False while no record could be pending: lets ops skip looking for
  // inherited failures (a load of one rarely written line).
  bool maybe_pending() const noexcept { return held_.load(std::memory_order_acquire) != 0; }
  std::string first_pending_message() const;

 private:
  mutable std::mutex mutex_;
  std::vector<ErrorRef> records_;
  std::atomic<std::size_t> held_{0};  // records_.size()
};

std::string describe_exception(const std::exception_ptr& error);

}  // namespace weft::detail
