// Profiler::write_dot: the dependency graph the engine built, rebuilt from the
// pushes in push order with the engine's own rules: a read waits for the last
// write; a write waits for the reads since the last write (or, if none, for
// the last write).
#include <deque>
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <ostream>
#include <set>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "profiler_impl.h"
#include "weft/error.h"

namespace weft {

namespace {

std::string dot_string(std::string_view s) {
  return nlohmann::json(std::string(s)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// One fill colour per device, cycling.
const char* device_colour(std::size_t i) {
  static const char* const colours[] = {"#9ecae1", "#fdae6b", "#a1d99b", "#bcbddc", "#fc9272", "#d9d9d9"};
  return colours[i % (sizeof colours / sizeof colours[0])];
}

}  // namespace

void Profiler::write_dot(std::ostream& os) const {
  std::deque<std::string> labels;
  std::vector<PushRecord> pushes = impl_->labelled_pushes(&labels);
  std::sort(pushes.begin(), pushes.end(), [](const PushRecord& a, const PushRecord& b) { return a.op_id < b.op_id; });

  struct VarState {
    std::uint64_t last_writer = 0;
    std::vector<std::uint64_t> readers;  // since the last write
  };
  std::unordered_map<std::uint64_t, VarState> vars;
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::set<std::string>> edges;  // (from, to) -> variables
  std::map<Device, std::size_t> device_index;
  for (const PushRecord& p : pushes) {
    device_index.try_emplace(p.device, device_index.size());
    for (const VarUse& v : p.vars) {
      VarState& st = vars[v.key];
      const std::string label(v.name);
      if (v.write) {
        if (!st.readers.empty()) {
          for (std::uint64_t r : st.readers)
            if (r != p.op_id) edges[{r, p.op_id}].insert(label);
        } else if (st.last_writer != 0) {
          edges[{st.last_writer, p.op_id}].insert(label);
        }
        st.last_writer = p.op_id;
        st.readers.clear();
      } else {
        if (st.last_writer != 0) edges[{st.last_writer, p.op_id}].insert(label);
        st.readers.push_back(p.op_id);
      }
    }
  }

  os << "digraph weft {\n  rankdir=LR;\n  node [shape=box, style=\"rounded,filled\", fontname=\"Helvetica\"];\n"
     << "  edge [fontname=\"Helvetica\", fontsize=9];\n";
  // One cluster per device, so the picture shows where each op ran.
  for (const auto& [device, index] : device_index) {
    os << "  subgraph cluster_" << index << " {\n    label=" << dot_string(device.str()) << ";\n    color=\"#888888\";\n";
    for (const PushRecord& p : pushes) {
      if (p.device != device) continue;
      os << "    op" << p.op_id << " [label=" << dot_string(std::string(detail::display_name(p.name)) + "\n#" +
                                                  std::to_string(p.op_id))
         << ", fillcolor=\"" << device_colour(index) << "\"];\n";
    }
    os << "  }\n";
  }
  for (const auto& [ends, labels] : edges) {
    std::string label;
    for (const std::string& l : labels) label += (label.empty() ? "" : ",") + l;
    os << "  op" << ends.first << " -> op" << ends.second << " [label=" << dot_string(label) << "];\n";
  }
  os << "}\n";
}

void Profiler::dump_dot(const std::string& path) const {
  errno = 0;
  std::ofstream out(path, std::ios::out | std::ios::trunc);
  if (!out) throw Error("weft::Profiler::dump_dot: cannot open '" + path + "' for writing: " + std::strerror(errno));
  write_dot(out);
  out.flush();
  if (!out) throw Error("weft::Profiler::dump_dot: cannot write '" + path + "'");
}

}  // namespace weft
