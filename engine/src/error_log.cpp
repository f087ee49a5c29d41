#include "error_log.h"

namespace weft::detail {

ErrorRef ErrorLog::add(std::exception_ptr error, std::string op_name) {
  auto record = std::make_shared<ErrorRecord>();
  record->error = std::move(error);
  record->op_name = std::move(op_name);
  std::lock_guard lock(mutex_);
  records_.push_back(record);
  held_.store(records_.size(), std::memory_order_release);
  return record;
}

void ErrorLog::report_all() {
  std::vector<ErrorRef> records;
  {
    std::lock_guard lock(mutex_);
    records.swap(records_);
    // Every record swapped out is claimed below: an op that races with this
    // wait_all and skips its failure check behaves as if it ran after it.
    held_.store(0, std::memory_order_release);
  }
  std::exception_ptr first;
  for (auto& record : records)
    if (record->claim() && !first) first = record->error;
  if (first) std::rethrow_exception(first);
}

std::size_t ErrorLog::pending() const {
  std::lock_guard lock(mutex_);
  std::size_t n = 0;
  for (auto& record : records_) n += record->pending();
  return n;
}

std::string ErrorLog::first_pending_message() const {
  std::lock_guard lock(mutex_);
  for (auto& record : records_)
    if (record->pending()) return "op '" + record->op_name + "': " + describe_exception(record->error);
  return {};
}

std::string describe_exception(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "non-standard exception";
  }
}

}  // namespace weft::detail
