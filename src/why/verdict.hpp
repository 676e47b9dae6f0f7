#pragma once
// ddp-why's reading of the flight recorders' dumps (ddp/comm/flight_recorder.hpp): every rank's
// record of one communicator, compared collective by collective. The verdict names the first
// sequence id where the ranks differ, how (op, count, dtype, root, reduce op, a rank that never
// issued it, a state), the ranks on each side with the trainer's tags, each rank's last
// completed collective, and the ranks whose dump is missing with their last collective as the
// others saw it.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ddp::why {

// Exit statuses of ddp-why (1 is a usage error).
enum exit_code : int { consistent = 0, differ = 2, missing_dump = 3, unreadable = 4 };

struct entry {
  std::uint64_t seq = 0;
  std::string op, dtype, reduce_op, purpose, state;
  std::uint64_t count = 0;
  int root = -1;
  std::int64_t step = -1;
  int bucket = -1;

  // What every rank must agree on.
  bool same_call(const entry& o) const {
    return op == o.op && count == o.count && dtype == o.dtype && root == o.root && reduce_op == o.reduce_op;
  }
  std::string tag() const {
    std::string t = step >= 0 ? "step " + std::to_string(step) + ", " : std::string("outside a step, ");
    if (bucket >= 0) t += "bucket " + std::to_string(bucket) + ", ";
    return t + purpose;
  }
  std::string describe() const {
    std::string d = op + " #" + std::to_string(seq) + " (count " + std::to_string(count) + ", " + dtype;
    if (op == "all_reduce" || op == "reduce_scatter") d += ", " + reduce_op;
    if (root >= 0) d += ", root " + std::to_string(root);
    return d + "; " + tag() + "; " + state + ")";
  }
};

struct dump {
  std::string path, backend, reason;
  int rank = -1, world = 0;
  std::uint64_t issued = 0;  // collectives the rank had issued when it dumped
  std::vector<entry> entries;
  const entry* at(std::uint64_t seq) const {
    if (entries.empty() || seq < entries.front().seq || seq > entries.back().seq) return nullptr;
    return &entries[seq - entries.front().seq];
  }
  const entry* last_completed() const {
    for (auto it = entries.rbegin(); it != entries.rend(); ++it)
      if (it->state == "completed") return &*it;
    return nullptr;
  }
};

// Reads one dump; throws std::runtime_error naming the file and what is wrong with it.
inline dump read_dump(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path.string() + ": cannot be opened");
  auto bad = [&](const std::string& what) { return std::runtime_error(path.string() + ": " + what); };
  dump d;
  d.path = path.string();
  std::string line;
  bool header = false, ended = false;
  std::size_t lines = 0;
  while (std::getline(in, line)) {
    ++lines;
    if (line.empty()) continue;
    if (ended) throw bad("line " + std::to_string(lines) + " follows the end line");
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception& e) {
      throw bad("line " + std::to_string(lines) + " is not JSON (" + e.what() + "): the file is cut or not a dump");
    }
    try {
      if (!header) {
        if (!j.contains("ddp_flight_recorder")) throw bad("the first line is not a ddp flight recorder header");
        d.backend = j.at("backend").get<std::string>();
        d.rank = j.at("rank").get<int>();
        d.world = j.at("world").get<int>();
        d.issued = j.at("issued").get<std::uint64_t>();
        d.reason = j.value("reason", "");
        header = true;
      } else if (j.contains("end")) {
        if (j.at("end").get<std::size_t>() != d.entries.size())
          throw bad("the end line counts " + std::to_string(j.at("end").get<std::size_t>()) + " entries, the file holds " +
                    std::to_string(d.entries.size()));
        ended = true;
      } else {
        entry e;
        e.seq = j.at("seq").get<std::uint64_t>();
        e.op = j.at("op").get<std::string>();
        e.count = j.at("count").get<std::uint64_t>();
        e.dtype = j.at("dtype").get<std::string>();
        e.reduce_op = j.at("reduce_op").get<std::string>();
        e.root = j.at("root").get<int>();
        e.step = j.at("step").get<std::int64_t>();
        e.bucket = j.at("bucket").get<int>();
        e.purpose = j.at("purpose").get<std::string>();
        e.state = j.at("state").get<std::string>();
        if (!d.entries.empty() && e.seq != d.entries.back().seq + 1)
          throw bad("entry #" + std::to_string(e.seq) + " does not follow #" + std::to_string(d.entries.back().seq));
        d.entries.push_back(std::move(e));
      }
    } catch (const nlohmann::json::exception& e) {
      throw bad("line " + std::to_string(lines) + " lacks a field or has one of the wrong type (" + e.what() + ")");
    }
  }
  if (!header) throw bad("empty: no header line");
  if (!ended) throw bad("no end line: the file is cut");
  return d;
}

struct side {
  std::vector<int> ranks;
  std::optional<entry> call;  // empty: these ranks never issued the collective
};

struct verdict {
  int status = consistent;
  std::string backend;
  int world = 0;
  std::string kind;  // op, count, dtype, root, reduce_op, not_issued, state; empty when none differ
  std::optional<std::uint64_t> sequence;
  std::vector<side> sides;  // largest first
  std::vector<int> odd;     // the ranks on the smaller side(s)
  std::map<int, std::optional<entry>> last_completed;
  std::vector<int> missing;                      // ranks whose dump is absent
  std::optional<entry> missing_last_together;    // the last collective every present rank completed
  std::optional<entry> missing_waited_for;       // the first that not every present rank completed
  std::vector<std::string> unreadable;           // why each unreadable dump is
  std::string text;                              // the report ddp-why prints
};

namespace detail {

inline std::string ranks_text(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

inline std::string field_that_differs(const entry& a, const entry& b) {
  if (a.op != b.op) return "op";
  if (a.count != b.count) return "count";
  if (a.dtype != b.dtype) return "dtype";
  if (a.root != b.root) return "root";
  return "reduce_op";
}

}  // namespace detail

// The verdict on the dumps of one communicator's ranks (one backend; `unreadable`: the reasons
// of dumps that could not be read).
inline verdict judge(std::vector<dump> dumps, std::vector<std::string> bad = {}) {
  verdict v;
  v.unreadable = std::move(bad);
  std::sort(dumps.begin(), dumps.end(), [](const dump& a, const dump& b) { return a.rank < b.rank; });
  for (const auto& d : dumps) {
    v.world = std::max(v.world, d.world);
    v.backend = d.backend;
  }
  std::set<int> present;
  for (const auto& d : dumps) present.insert(d.rank);
  for (int r = 0; r < v.world; ++r)
    if (!present.count(r)) v.missing.push_back(r);
  for (const auto& d : dumps)
    v.last_completed[d.rank] = d.last_completed() ? std::optional<entry>(*d.last_completed()) : std::nullopt;

  // Sequence ids every present rank may speak of: from the newest ring start to the last issued.
  std::uint64_t first = 0, last = 0;
  bool any = false;
  for (const auto& d : dumps) {
    if (d.issued > 0) last = std::max(last, d.issued - 1), any = true;
    if (!d.entries.empty()) first = std::max(first, d.entries.front().seq);
  }
  std::optional<std::uint64_t> state_differs;
  for (std::uint64_t s = first; any && s <= last && !v.sequence; ++s) {
    std::vector<side> sides;
    for (const auto& d : dumps) {
      std::optional<entry> e;
      if (s < d.issued) {
        const entry* p = d.at(s);
        if (!p) continue;  // outside its ring
        e = *p;
      }
      auto it = std::find_if(sides.begin(), sides.end(), [&](const side& x) {
        return x.call.has_value() == e.has_value() && (!e || x.call->same_call(*e));
      });
      if (it == sides.end()) sides.push_back(side{{d.rank}, e});
      else it->ranks.push_back(d.rank);
    }
    if (sides.size() > 1) {
      std::stable_sort(sides.begin(), sides.end(), [](const side& a, const side& b) {
        if (a.ranks.size() != b.ranks.size()) return a.ranks.size() > b.ranks.size();
        return a.call.has_value() > b.call.has_value();
      });
      v.sequence = s;
      const auto none = std::find_if(sides.begin(), sides.end(), [](const side& x) { return !x.call; });
      v.kind = none != sides.end() ? "not_issued" : detail::field_that_differs(*sides[0].call, *sides[1].call);
      v.sides = std::move(sides);
    } else if (!state_differs && sides.size() == 1 && sides[0].call) {
      bool completed = false, pending = false;
      for (const auto& d : dumps)
        if (const entry* p = s < d.issued ? d.at(s) : nullptr) (p->state == "completed" ? completed : pending) = true;
      if (completed && pending) state_differs = s;
    }
  }
  if (!v.sequence && state_differs) {
    v.sequence = state_differs;
    v.kind = "state";
    for (const auto& d : dumps) {
      const entry* p = *state_differs < d.issued ? d.at(*state_differs) : nullptr;
      if (!p) continue;
      auto it = std::find_if(v.sides.begin(), v.sides.end(), [&](const side& x) { return x.call->state == p->state; });
      if (it == v.sides.end()) v.sides.push_back(side{{d.rank}, *p});
      else it->ranks.push_back(d.rank);
    }
    std::stable_sort(v.sides.begin(), v.sides.end(),
                     [](const side& a, const side& b) { return a.ranks.size() > b.ranks.size(); });
  }
  if (v.sides.size() > 1) {
    const std::size_t smallest = v.sides.back().ranks.size();
    if (smallest < v.sides.front().ranks.size())
      for (const auto& s : v.sides)
        if (s.ranks.size() == smallest) v.odd.insert(v.odd.end(), s.ranks.begin(), s.ranks.end());
  }
  // A rank without a dump took part in every collective that completed on all the others (none
  // completes without every rank); the first one that did not is where they wait for it.
  if (!v.missing.empty() && !dumps.empty()) {
    std::optional<std::uint64_t> together;
    for (std::uint64_t s = first; any && s <= last; ++s) {
      bool all = true;
      for (const auto& d : dumps) {
        const entry* p = s < d.issued ? d.at(s) : nullptr;
        all = all && p && p->state == "completed";
      }
      if (!all) {
        for (const auto& d : dumps)
          if (const entry* p = s < d.issued ? d.at(s) : nullptr) {
            v.missing_waited_for = *p;
            break;
          }
        break;
      }
      together = s;
    }
    if (together) v.missing_last_together = *dumps.front().at(*together);
  }

  std::ostringstream out;
  out << "ddp-why: " << dumps.size() << " dump(s) of " << (v.backend.empty() ? "?" : v.backend) << " (world "
      << v.world << ")\n";
  for (const auto& u : v.unreadable) out << "unreadable: " << u << "\n";
  if (!v.missing.empty()) {
    out << "missing dump: " << detail::ranks_text(v.missing) << " (killed, or it never reached a dump)\n";
    out << "  its last collective as the others saw it: "
        << (v.missing_last_together ? v.missing_last_together->describe() + ", completed by every other rank"
                                    : std::string("none completed"))
        << "\n";
    if (v.missing_waited_for) out << "  the others wait for it in " << v.missing_waited_for->describe() << "\n";
  }
  if (v.sequence) {
    out << "first difference: collective #" << *v.sequence << ", kind: " << v.kind << "\n";
    for (const auto& s : v.sides)
      out << "  " << detail::ranks_text(s.ranks) << ": "
          << (s.call ? s.call->describe() : std::string("never issued it (its record ends before)")) << "\n";
    if (!v.odd.empty()) out << "  odd one out: " << detail::ranks_text(v.odd) << "\n";
    // A trainer agrees on its policies at the first step after a one_of's select(): ranks that
    // agree where the others do something else selected where the others did not.
    std::vector<int> agreeing;
    for (const auto& s : v.sides)
      if (s.call && s.call->purpose == "policy_agreement") agreeing.insert(agreeing.end(), s.ranks.begin(), s.ranks.end());
    if (!agreeing.empty() && agreeing.size() < dumps.size())
      out << "  " << detail::ranks_text(agreeing) << (agreeing.size() == 1 ? " agrees" : " agree")
          << " on the trainer's policies, as a trainer does at the first step after a one_of's select(), where the "
             "others do not: select alike on every rank, before the same step\n";
  } else if (v.missing.empty() && v.unreadable.empty()) {
    out << "consistent: every rank issued the same collectives\n";
  }
  out << "last completed collective:\n";
  for (const auto& [rank, e] : v.last_completed)
    out << "  rank " << rank << ": " << (e ? e->describe() : std::string("none")) << "\n";
  for (const auto& d : dumps)
    if (!d.reason.empty()) out << "rank " << d.rank << " dumped because: " << d.reason << "\n";
  v.text = out.str();
  v.status = !v.unreadable.empty() ? exit_code::unreadable
             : !v.missing.empty()   ? exit_code::missing_dump
             : v.sequence           ? exit_code::differ
                                    : exit_code::consistent;
  return v;
}

// The dumps of `backend` under `dir` (<backend>.rank<r>.jsonl), judged. Unreadable ones are named.
inline verdict judge_folder(const std::filesystem::path& dir, const std::string& backend) {
  std::vector<dump> dumps;
  std::vector<std::string> bad;
  const std::string prefix = backend + ".rank";
  for (const auto& f : std::filesystem::directory_iterator(dir)) {
    const std::string name = f.path().filename().string();
    if (name.rfind(prefix, 0) != 0 || f.path().extension() != ".jsonl") continue;
    try {
      dumps.push_back(read_dump(f.path()));
    } catch (const std::exception& e) {
      bad.push_back(e.what());
    }
  }
  return judge(std::move(dumps), std::move(bad));
}

// The backends that have dumps under `dir`.
inline std::vector<std::string> backends_in(const std::filesystem::path& dir) {
  std::set<std::string> found;
  for (const auto& f : std::filesystem::directory_iterator(dir)) {
    const std::string name = f.path().filename().string();
    const auto at = name.find(".rank");
    if (at != std::string::npos && f.path().extension() == ".jsonl") found.insert(name.substr(0, at));
  }
  return {found.begin(), found.end()};
}

}  // namespace ddp::why
