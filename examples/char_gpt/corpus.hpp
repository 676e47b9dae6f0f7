#pragma once
// The corpus and its split, fixed: the 43 fortune files of Debian's `fortunes` and `fortunes-min`
// packages (/usr/share/games/fortunes, the files without an extension: not the .dat indexes, not
// the .u8 links), concatenated in name order, 2,576,674 bytes; the last tenth of the bytes is the
// validation text (257,667 bytes: the end of startrek, then tao, translate-me, wisdom, work and
// zippy), the rest the training text. Tokens are bytes (256 of them).
//
// A sequence is a window of `length` + 1 bytes at a stride of `length`: its first `length` bytes
// are the tokens, its last `length` the targets (the next byte of each). Over a text's windows
// every byte after the first is a target exactly once.
#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "config.hpp"
#include "ddp/nn/gpt.hpp"

namespace char_gpt {

inline constexpr const char* corpus_package_hint =
    "the corpus is the English text of Debian's `fortunes` package: install it with `apt-get install fortunes` "
    "(scripts/install-deps.sh does), or give --corpus a directory holding its files";

// fortunes 1:1.99.1-7.3 (Debian 12); fortunes, literature and riddles come from fortunes-min.
inline constexpr std::array<std::string_view, 43> corpus_files = {
    "art",       "ascii-art",  "computers", "cookie",        "debian",   "definitions", "disclaimer", "drugs",
    "education", "ethnic",     "food",      "fortunes",      "goedel",   "humorists",   "kids",       "knghtbrd",
    "law",       "linux",      "linuxcookie", "literature",  "love",     "magic",       "medicine",   "men-women",
    "miscellaneous", "news",   "paradoxum", "people",        "perl",     "pets",        "platitudes", "politics",
    "pratchett", "riddles",    "science",   "songs-poems",   "sports",   "startrek",    "tao",        "translate-me",
    "wisdom",    "work",       "zippy"};

struct corpus {
  std::vector<std::uint8_t> train, validation;

  // Reads the files from `directory`; a missing one is an error naming the package.
  static corpus load(const std::string& directory) {
    namespace fs = std::filesystem;
    std::vector<std::uint8_t> all;
    for (std::string_view name : corpus_files) {
      const fs::path path = fs::path(directory) / name;
      std::ifstream in(path, std::ios::binary);
      if (!fs::is_regular_file(path) || !in)
        throw std::runtime_error("no corpus file '" + path.string() + "': " + corpus_package_hint);
      all.insert(all.end(), std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    const std::size_t cut = all.size() - all.size() / 10;
    return {std::vector<std::uint8_t>(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(cut)),
            std::vector<std::uint8_t>(all.begin() + static_cast<std::ptrdiff_t>(cut), all.end())};
  }
};

// A collated batch: the model's input (B sequences of T tokens) and the targets, row b*T + t.
struct batch : ddp::nn::token_batch {
  std::vector<std::int32_t> targets;
};

// A text as a data set (ddp::data::dataset) of windows. `limit` keeps that many windows spread
// evenly over the text (0: all), for a cheaper estimate of a loss over all of it.
class windows {
 public:
  using example_type = std::span<const std::uint8_t>;

  windows(const std::vector<std::uint8_t>& text, std::size_t length, std::size_t limit = 0)
      : text_(&text), length_(length), all_(text.size() > length ? (text.size() - 1) / length : 0), count_(all_) {
    if (length == 0) throw std::invalid_argument("char_gpt::windows: the sequence length must be at least 1");
    if (limit) count_ = std::min(count_, limit);
  }
  windows(std::vector<std::uint8_t>&&, std::size_t, std::size_t = 0) = delete;  // keeps a pointer to the text

  std::size_t size() const { return count_; }
  example_type get(std::size_t i) const {
    const std::size_t w = count_ == all_ ? i : i * all_ / count_;
    return {text_->data() + w * length_, length_ + 1};
  }

  static batch collate(std::span<const example_type> examples) {
    batch b;
    b.sequences = examples.size();
    b.length = examples.empty() ? 0 : examples.front().size() - 1;
    b.tokens.reserve(b.sequences * b.length);
    b.targets.reserve(b.sequences * b.length);
    for (const auto& e : examples) {
      b.tokens.insert(b.tokens.end(), e.begin(), e.end() - 1);
      b.targets.insert(b.targets.end(), e.begin() + 1, e.end());
    }
    return b;
  }

 private:
  const std::vector<std::uint8_t>* text_;
  std::size_t length_, all_, count_;
};

}  // namespace char_gpt
