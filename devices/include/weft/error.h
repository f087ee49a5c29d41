// weft::Error — every error Weft itself raises (bad input, misuse, failed
// resources). Exceptions thrown by user ops keep their own type: the engine
// stores and rethrows them as they were.
#pragma once

#include <stdexcept>

namespace weft {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace weft
