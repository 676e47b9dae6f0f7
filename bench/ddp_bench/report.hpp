#pragma once
// What every ddp-bench subcommand produces: a table (printed for a person as rows arrive) and,
// with --out, the same rows as CSV or JSON together with the command line, the date, the machine
// and the library version, so a file says what produced it.
#include <string>
#include <variant>
#include <vector>

namespace bench {

// A cell: a number (printed with the column's precision), a count, or text ("n/a").
using cell = std::variant<double, long long, std::string>;

struct column {
  std::string name;   // as in the CSV/JSON keys and the printed header
  int width = 10;
  int precision = 2;  // digits after the point, for doubles
};

// The machine and software a result came from (CPU model and cores; GPU, driver, CUDA runtime and
// NCCL versions where a GPU build found them).
struct machine_info {
  std::string cpu;
  unsigned cores = 0;
  std::string gpu, driver, cuda_runtime, nccl;
};
machine_info describe_machine();
// ddp's version, as every report records it.
const char* library_version();
// Filled in by a GPU build before a run (bench/ddp_bench/collective_nccl.cpp).
void set_gpu_info(std::string gpu, std::string driver, std::string cuda_runtime, std::string nccl);

class report {
 public:
  report(std::string subcommand, std::string title, std::vector<column> columns);

  // Prints the title, the command and the machine, then the header (on rank 0 only: `print`).
  void begin(bool print);
  void add(std::vector<cell> row);
  // Writes --out (".json": JSON, else CSV); an empty path writes nothing. Throws naming the path.
  void write(const std::string& path) const;
  // A line under the table (a ratio, a note): printed, and kept in the file's "notes".
  void note(const std::string& text);
  const std::vector<std::vector<cell>>& rows() const noexcept { return rows_; }

 private:
  std::string subcommand_, title_;
  std::vector<column> columns_;
  std::vector<std::vector<cell>> rows_;
  std::vector<std::string> notes_;
  bool print_ = true;
};

// The median of `v` (0 when empty): the summary of repeated measurements.
double median(std::vector<double> v);
// The q-th percentile of `v` (0 < q <= 100) by the nearest rank: the smallest value with at least
// q % of the values at or below it (100: the largest); 0 when empty.
double percentile(std::vector<double> v, double q);

// The command line as typed, and the UTC date and time.
void set_command_line(int argc, char** argv);
const std::string& command_line();
std::string utc_now();

}  // namespace bench
