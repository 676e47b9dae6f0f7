#include "report.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <stdexcept>
#include <thread>

#ifndef DDP_VERSION
#define DDP_VERSION "unknown"
#endif

namespace bench {

const char* library_version() { return DDP_VERSION; }
namespace {

std::string& command_storage() {
  static std::string s;
  return s;
}
machine_info& gpu_storage() {
  static machine_info m;
  return m;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.starts_with("model name")) {
      const auto colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(line.find_first_not_of(' ', colon + 1));
    }
  return "unknown";
}

std::string format(const cell& c, const column& col) {
  char buf[64];
  if (const auto* d = std::get_if<double>(&c)) std::snprintf(buf, sizeof buf, "%.*f", col.precision, *d);
  else if (const auto* n = std::get_if<long long>(&c)) std::snprintf(buf, sizeof buf, "%lld", *n);
  else return std::get<std::string>(c);
  return buf;
}

nlohmann::json to_json(const cell& c) {
  if (const auto* d = std::get_if<double>(&c)) return *d;
  if (const auto* n = std::get_if<long long>(&c)) return *n;
  return std::get<std::string>(c);
}

std::string csv_field(std::string s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char ch : s) out += ch == '"' ? std::string("\"\"") : std::string(1, ch);
  return out + "\"";
}

}  // namespace

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::ranges::sort(v);
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::ranges::sort(v);
  const auto rank = static_cast<std::size_t>(std::ceil(q / 100 * static_cast<double>(v.size())));
  return v[std::clamp<std::size_t>(rank, 1, v.size()) - 1];
}

void set_command_line(int argc, char** argv) {
  auto& s = command_storage();
  s.clear();
  for (int i = 0; i < argc; ++i) s += (i ? " " : "") + std::string(argv[i]);
}
const std::string& command_line() { return command_storage(); }

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

void set_gpu_info(std::string gpu, std::string driver, std::string cuda_runtime, std::string nccl) {
  auto& m = gpu_storage();
  m.gpu = std::move(gpu), m.driver = std::move(driver), m.cuda_runtime = std::move(cuda_runtime), m.nccl = std::move(nccl);
}

machine_info describe_machine() {
  machine_info m = gpu_storage();
  m.cpu = cpu_model();
  m.cores = std::thread::hardware_concurrency();
  return m;
}

report::report(std::string subcommand, std::string title, std::vector<column> columns)
    : subcommand_(std::move(subcommand)), title_(std::move(title)), columns_(std::move(columns)) {}

void report::begin(bool print) {
  print_ = print;
  if (!print_) return;
  const auto m = describe_machine();
  std::printf("# ddp-bench %s: %s\n# command: %s\n# %s, %s, %u hardware threads", subcommand_.c_str(), title_.c_str(),
              command_line().c_str(), utc_now().c_str(), m.cpu.c_str(), m.cores);
  if (!m.gpu.empty())
    std::printf("; %s, driver %s, CUDA runtime %s, NCCL %s", m.gpu.c_str(), m.driver.c_str(), m.cuda_runtime.c_str(),
                m.nccl.c_str());
  std::printf("; ddp %s\n", DDP_VERSION);
  for (const auto& c : columns_) std::printf("%*s ", c.width, c.name.c_str());
  std::printf("\n");
  std::fflush(stdout);
}

void report::add(std::vector<cell> row) {
  if (row.size() != columns_.size()) throw std::logic_error("ddp-bench: a row with another number of cells than columns");
  if (print_) {
    for (std::size_t i = 0; i < row.size(); ++i) std::printf("%*s ", columns_[i].width, format(row[i], columns_[i]).c_str());
    std::printf("\n");
    std::fflush(stdout);
  }
  rows_.push_back(std::move(row));
}

void report::note(const std::string& text) {
  if (print_) std::printf("%s\n", text.c_str());
  notes_.push_back(text);
}

void report::write(const std::string& path) const {
  if (path.empty()) return;
  const auto m = describe_machine();
  std::ofstream out(path, std::ios::trunc);
  if (path.ends_with(".json")) {
    nlohmann::json j;
    j["tool"] = "ddp-bench";
    j["subcommand"] = subcommand_;
    j["title"] = title_;
    j["command"] = command_line();
    j["date"] = utc_now();
    j["library_version"] = DDP_VERSION;
    j["machine"] = {{"cpu", m.cpu}, {"cores", m.cores}};
    if (!m.gpu.empty())
      j["machine"].update({{"gpu", m.gpu}, {"driver", m.driver}, {"cuda_runtime", m.cuda_runtime}, {"nccl", m.nccl}});
    j["columns"] = nlohmann::json::array();
    for (const auto& c : columns_) j["columns"].push_back(c.name);
    j["rows"] = nlohmann::json::array();
    for (const auto& row : rows_) {
      nlohmann::json r;
      for (std::size_t i = 0; i < row.size(); ++i) r[columns_[i].name] = to_json(row[i]);
      j["rows"].push_back(std::move(r));
    }
    j["notes"] = notes_;
    out << j.dump(1) << "\n";
  } else {
    out << "# ddp-bench " << subcommand_ << ": " << title_ << "\n# command: " << command_line() << "\n# date: " << utc_now()
        << "\n# machine: " << m.cpu << ", " << m.cores << " hardware threads";
    if (!m.gpu.empty())
      out << "; " << m.gpu << ", driver " << m.driver << ", CUDA runtime " << m.cuda_runtime << ", NCCL " << m.nccl;
    out << "\n# library_version: " << DDP_VERSION << "\n";
    for (const auto& n : notes_) out << "# note: " << n << "\n";
    for (std::size_t i = 0; i < columns_.size(); ++i) out << (i ? "," : "") << csv_field(columns_[i].name);
    out << "\n";
    for (const auto& row : rows_) {
      for (std::size_t i = 0; i < row.size(); ++i) out << (i ? "," : "") << csv_field(format(row[i], columns_[i]));
      out << "\n";
    }
  }
  out.close();
  if (!out) throw std::runtime_error("ddp-bench: cannot write --out '" + path + "'; check that its directory exists");
}

}  // namespace bench
