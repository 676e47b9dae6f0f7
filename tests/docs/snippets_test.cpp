// Docs cannot go stale: every ```cpp block of docs/ and README.md is, word for word, a region of
// a source file that the build compiles (docs/snippets/*.cpp, tests/support/*.hpp, ...), marked
//   // [doc: trainer.md]            (the page, relative to docs/; README.md for the root README)
//   ...the block...
//   // [end doc]
// and every such region appears in its page. A region inside a function is compared without its
// common indentation. Every block starts with the #include lines it needs.
//
// The docs speak of the library alone: no page of docs/ nor README.md, and no comment in include/,
// src/, bench/ or examples/, tells how ddp was developed (work periods counted by ordinals, the
// tools and trackers it was developed with). The words are listed in `development_words` below.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

const fs::path root = DDP_SOURCE_DIR;

struct snippet {
  std::string page;   // docs-relative page
  fs::path file;      // where it was found
  std::size_t line;   // 1-based line of its first line of text
  std::vector<std::string> lines;
  bool matched = false;
};

std::vector<std::string> read_lines(const fs::path& p) {
  std::ifstream in(p);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// Without the lines' common indentation (a block inside a list item, a region inside a function).
void dedent(std::vector<std::string>& lines) {
  std::size_t indent = std::string::npos;
  for (const auto& l : lines)
    if (!trim(l).empty()) indent = std::min(indent, l.find_first_not_of(' '));
  for (auto& l : lines) l = trim(l).empty() ? "" : l.substr(indent);
}

std::vector<snippet> doc_blocks() {
  std::vector<snippet> out;
  std::vector<std::pair<fs::path, std::string>> pages{{root / "README.md", "README.md"}};
  for (const auto& e : fs::recursive_directory_iterator(root / "docs"))
    if (e.path().extension() == ".md") pages.emplace_back(e.path(), fs::relative(e.path(), root / "docs").string());
  for (const auto& [path, page] : pages) {
    const auto lines = read_lines(path);
    for (std::size_t i = 0; i < lines.size(); ++i) {
      if (trim(lines[i]) != "```cpp") continue;
      snippet s{page, path, i + 2, {}};
      for (++i; i < lines.size() && trim(lines[i]) != "```"; ++i) s.lines.push_back(lines[i]);
      dedent(s.lines);
      out.push_back(std::move(s));
    }
  }
  return out;
}

std::vector<snippet> source_regions() {
  std::vector<snippet> out;
  std::vector<fs::path> files;
  for (const char* dir : {"docs/snippets", "tests", "examples"})
    for (const auto& e : fs::recursive_directory_iterator(root / dir)) {
      const auto ext = e.path().extension();
      if (ext == ".cpp" || ext == ".hpp" || ext == ".cu" || ext == ".cuh") files.push_back(e.path());
    }
  const std::string open = "// [doc: ", close = "// [end doc]";
  for (const auto& f : files) {
    if (f.filename() == "snippets_test.cpp") continue;  // this file names the marks
    const auto lines = read_lines(f);
    for (std::size_t i = 0; i < lines.size(); ++i) {
      const std::string t = trim(lines[i]);
      if (t.rfind(open, 0) != 0) continue;
      snippet s{t.substr(open.size(), t.size() - open.size() - 1), f, i + 2, {}};
      for (++i; i < lines.size() && trim(lines[i]) != close; ++i) s.lines.push_back(lines[i]);
      dedent(s.lines);
      out.push_back(std::move(s));
    }
  }
  return out;
}

// Where two line lists first differ, for the message.
std::string first_difference(const snippet& doc, const snippet& src) {
  std::size_t i = 0;
  while (i < doc.lines.size() && i < src.lines.size() && doc.lines[i] == src.lines[i]) ++i;
  std::ostringstream m;
  m << "the nearest region (" << fs::relative(src.file, root).string() << ":" << src.line << ") differs at its line "
    << i + 1 << ":\n  page:   " << (i < doc.lines.size() ? doc.lines[i] : "(ends)")
    << "\n  source: " << (i < src.lines.size() ? src.lines[i] : "(ends)");
  return m.str();
}

// Words about how ddp was developed, not about what it is. Case-insensitive. A number after
// "issue" is this project's tracker unless another project is named right before it ("OpenBLAS
// issue #4267", "PyTorch issue 67570"): those speak of the world.
struct development_word {
  std::regex re;
  const char* what;
  bool unless_another_project = false;  // an issue number is another project's when it is named before it
};

const std::vector<development_word>& development_words() {
  constexpr auto icase = std::regex::ECMAScript | std::regex::icase;
  static const std::string ordinal =
      "(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|"
      "fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|\\d+(st|nd|rd|th))";
  static const std::vector<development_word> words{
      {std::regex("\\b" + ordinal + "[\\s-]+(sessions?|waves?|sittings?|work periods?)\\b", icase),
       "a work period counted by an ordinal"},
      {std::regex("\\bsessions?\\b", icase), "a work session"},
      {std::regex("\\bsub-?agents?\\b", icase), "a development agent"},
      {std::regex("\\bhelper\\s+(agents?|engineers?|sessions?)\\b", icase), "a development helper"},
      {std::regex("\\b(claude|chatgpt|copilot|codex)\\b", icase), "a development tool"},
      {std::regex("\\b(lent|lending|not drawn|device tool|give_back|budget_left_s|can_start_another)\\b", icase),
       "the GPU lending tool"},
      {std::regex("\\bissues?\\s+#?\\d+", icase), "this project's issue tracker", true},
      {std::regex("\\bthe issue's\\b", icase), "this project's issue tracker"},
  };
  return words;
}

// Another project's tracker: its name right before "issue".
bool names_another_project(const std::string& before) {
  static const std::regex project(
      "(openblas|pytorch|torch|nccl-tests|nccl|torchtitan|open ?mpi|libtorch|gcc|llvm|clang|cuda|range-v3|cli11|"
      "doctest|slurm|zlib|cmake)\\s*$",
      std::regex::ECMAScript | std::regex::icase);
  return std::regex_search(before, project);
}

struct found_word {
  std::string word;
  std::string what;
};

std::vector<found_word> development_words_in(const std::string& text) {
  std::vector<found_word> out;
  for (const auto& w : development_words())
    for (std::sregex_iterator it(text.begin(), text.end(), w.re), end; it != end; ++it) {
      if (w.unless_another_project &&
          names_another_project(text.substr(0, static_cast<std::size_t>(it->position()))))
        continue;
      out.push_back({it->str(), w.what});
    }
  return out;
}

// What the scan reads of a source file's line: its // comment, if any.
std::string comment_of(const std::string& line) {
  const auto at = line.find("//");
  return at == std::string::npos ? std::string() : line.substr(at);
}

}  // namespace

TEST_CASE("the docs-words scan flags work periods, tools and this project's issues, and nothing else") {
  for (const char* line : {"## CI, tenth session", "(eleventh session, 2026-12-02)", "the sixteenth sessions' code",
                           "the 3rd session", "a second wave of work", "what the session found", "asked a subagent",
                           "the helper agent measured", "no GPU has been lent (the device tool's status)",
                           "\"not drawn\"", "measured for issue 33", "(issues 17, 18)", "the issue's target",
                           "#14 and issue #15"}) {
    CAPTURE(line);
    CHECK_FALSE(development_words_in(line).empty());
  }
  for (const char* line : {"OpenBLAS issue #4267, fixed in 0.3.25", "(PyTorch issue 67570)", "nccl-tests issue 120",
                           "torchtitan issue 3029", "collectives complete in issue order", "the issue modes",
                           "one wave of `kernel` on the device", "a few waves of the SMs",
                           "a remote-shell agent", "the first forward", "at a tenth of the rate", "every rank must issue",
                           "talent", "all_reduce #1 made no progress"}) {
    CAPTURE(line);
    CHECK(development_words_in(line).empty());
  }
}

TEST_CASE("docs/, README.md and the sources' comments speak of the library, not of how it was developed") {
  std::vector<std::pair<fs::path, bool>> files{{root / "README.md", false}};  // (file, comments only)
  for (const auto& e : fs::recursive_directory_iterator(root / "docs"))
    if (e.path().extension() == ".md") files.emplace_back(e.path(), false);
  for (const char* dir : {"include", "src", "bench", "examples"})
    for (const auto& e : fs::recursive_directory_iterator(root / dir)) {
      const auto ext = e.path().extension();
      if (ext == ".hpp" || ext == ".cpp" || ext == ".cuh" || ext == ".cu") files.emplace_back(e.path(), true);
    }
  REQUIRE(files.size() >= 100);  // fewer means the scan broke
  std::size_t lines_read = 0;
  for (const auto& [file, comments_only] : files) {
    const auto lines = read_lines(file);
    for (std::size_t i = 0; i < lines.size(); ++i, ++lines_read)
      for (const auto& f : development_words_in(comments_only ? comment_of(lines[i]) : lines[i]))
        FAIL_CHECK(fs::relative(file, root).string() << ":" << i + 1 << ": \"" << f.word << "\" (" << f.what
                                                     << "): say what the library does or what was measured, and when");
  }
  CHECK(lines_read > 10000);
}

TEST_CASE("every ```cpp block in docs/ and README.md is a compiled region, and every region is shown") {
  auto blocks = doc_blocks();
  auto regions = source_regions();
  REQUIRE(blocks.size() >= 20);  // the pages have at least this many; fewer means the scan broke
  for (auto& b : blocks) {
    const std::string where = fs::relative(b.file, root).string() + ":" + std::to_string(b.line);
    CAPTURE(where);
    const bool has_include = !b.lines.empty() && b.lines.front().rfind("#include", 0) == 0;
    CHECK_MESSAGE(has_include, where << ": a snippet starts with the #include lines it needs");
    const snippet* nearest = nullptr;
    std::size_t best = 0;
    for (auto& r : regions) {
      if (r.page != b.page) continue;
      if (r.lines == b.lines) {
        r.matched = b.matched = true;
        break;
      }
      std::size_t same = 0;  // lines equal at the same position: the region the block came from
      for (std::size_t i = 0; i < std::min(r.lines.size(), b.lines.size()); ++i) same += r.lines[i] == b.lines[i];
      if (!nearest || same > best) nearest = &r, best = same;
    }
    if (!b.matched)
      FAIL_CHECK(where << ": this ```cpp block is compiled nowhere: no `// [doc: " << b.page
                       << "]` region in docs/snippets/, tests/ or examples/ has its text; "
                       << (nearest ? first_difference(b, *nearest) : std::string("there is no region for the page")));
  }
  for (const auto& r : regions)
    if (!r.matched)
      FAIL_CHECK(fs::relative(r.file, root).string() << ":" << r.line << ": this region for " << r.page
                                                     << " is in no ```cpp block of that page (stale, or the page changed)");
}
