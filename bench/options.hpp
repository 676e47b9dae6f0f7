#pragma once
// The benchmarks' command-line flags, parsed by CLI11 in one translation unit (options.cpp,
// compiled once and without the benchmarks' -O3): CLI11 2.1 is header-only and costs about
// 9 s of compile time in every file that includes it.
#include <climits>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace bench {

class options {
 public:
  explicit options(const std::string& description);
  ~options();
  options(const options&) = delete;
  options& operator=(const options&) = delete;

  void add(const std::string& flag, int& value, const std::string& help, int min = INT_MIN, int max = INT_MAX);
  void add(const std::string& flag, std::size_t& value, const std::string& help, std::size_t min = 0,
           std::size_t max = SIZE_MAX);
  // choices empty: any string.
  void add(const std::string& flag, std::string& value, const std::string& help,
           const std::vector<std::string>& choices = {});
  // A comma-separated list.
  void add(const std::string& flag, std::vector<std::size_t>& value, const std::string& help);

  // After --help or a bad flag (both printed): the exit code main should return.
  std::optional<int> parse(int argc, char** argv);

 private:
  std::unique_ptr<CLI::App> app_;
};

}  // namespace bench
