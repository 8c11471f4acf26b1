#include "fsdpx/framework/base/fault_injection.h"

#include <cstdlib>

namespace fsdpx {

std::optional<Fault> requested_fault() {
  const char* f = std::getenv("FSDPX_FAULT");
  if (!f) return std::nullopt;
  const std::string text = f;
  const size_t colon = text.find(':');
  if (colon == std::string::npos || colon == 0) return std::nullopt;
  const size_t second = text.find(':', colon + 1);
  const std::string rank = text.substr(colon + 1, second == std::string::npos ? std::string::npos : second - colon - 1);
  if (rank.empty() || rank.size() > 9 || rank.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  Fault fault;
  fault.point = text.substr(0, colon);
  fault.rank = std::stoi(rank);
  if (second != std::string::npos) fault.where = text.substr(second + 1);
  return fault;
}

bool fault_requested(const std::string& point, int rank, const std::string& where) {
  const std::optional<Fault> f = requested_fault();
  return f && f->point == point && f->rank == rank && f->where == where;
}

}  // namespace fsdpx
