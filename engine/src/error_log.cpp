#include "error_log.h"

#include <algorithm>

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

void ErrorLog::report_all(std::uint64_t next_op_id) {
  std::vector<ErrorRef> records;
  {
    std::lock_guard lock(mutex_);
    records.swap(records_);
    // Ops pushed before this report still inherit the failures it forgets.
    std::uint64_t before = forgotten_before_.load(std::memory_order_relaxed);
    forgotten_before_.store(std::max(before, next_op_id), std::memory_order_release);
    held_.store(0, std::memory_order_release);
  }
  std::exception_ptr first;
  for (auto& record : records)
    if (record->claim(next_op_id) && !first) first = record->error;
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
