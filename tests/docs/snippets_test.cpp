// Docs cannot go stale: every ```cpp block of docs/ and README.md is, word for word, a region of
// a source file that the build compiles (docs/snippets/*.cpp, tests/support/*.hpp, ...), marked
//   // [doc: trainer.md]            (the page, relative to docs/; README.md for the root README)
//   ...the block...
//   // [end doc]
// and every such region appears in its page. A region inside a function is compared without its
// common indentation. Every block starts with the #include lines it needs.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
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

}  // namespace

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
