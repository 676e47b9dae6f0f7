#include "options.hpp"

#include <CLI/CLI.hpp>

#include <limits>

namespace bench {
namespace {

// CLI::Range, but an open upper end reads "[min, ...)" rather than the type's maximum.
template <class T>
CLI::Validator within(T min, T max) {
  if (max < std::numeric_limits<T>::max()) return CLI::Range(min, max);
  return CLI::Validator(
      [min](std::string& text) -> std::string {
        T value{};
        if (!CLI::detail::lexical_cast(text, value)) return "'" + text + "' is not a number";
        if (value < min) return "Value " + text + " is less than " + std::to_string(min);
        return {};
      },
      "[" + std::to_string(min) + ", ...)");
}

}  // namespace

options::options(const std::string& description) : app_(std::make_unique<CLI::App>(description)) {}
options::~options() = default;

void options::add(const std::string& flag, int& value, const std::string& help, int min, int max) {
  auto* option = app_->add_option(flag, value, help)->capture_default_str();
  if (min > INT_MIN || max < INT_MAX) option->check(within(min, max));
}

void options::add(const std::string& flag, std::size_t& value, const std::string& help, std::size_t min,
                  std::size_t max) {
  app_->add_option(flag, value, help)->check(within(min, max))->capture_default_str();
}

void options::add(const std::string& flag, std::string& value, const std::string& help,
                  const std::vector<std::string>& choices) {
  auto* option = app_->add_option(flag, value, help)->capture_default_str();
  if (!choices.empty()) option->check(CLI::IsMember(choices));
}

void options::add(const std::string& flag, std::vector<std::size_t>& value, const std::string& help) {
  app_->add_option(flag, value, help)->delimiter(',')->capture_default_str();
}

std::optional<int> options::parse(int argc, char** argv) {
  try {
    app_->parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app_->exit(e);
  }
  return std::nullopt;
}

}  // namespace bench
