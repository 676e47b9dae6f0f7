// doctest's main, with one rule more: a run that executes no test case fails. ctest runs each
// case by name (--test-case=NAME, from doctest_discover_tests); a name that matches nothing (CMake
// splits names at ';', for one) would otherwise pass having tested nothing.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

namespace {

int cases_run = 0;

struct count_cases : doctest::IReporter {
  explicit count_cases(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_start(const doctest::TestCaseData&) override { ++cases_run; }
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};

}  // namespace

REGISTER_LISTENER("count_cases", 1, count_cases);

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int code = context.run();
  if (context.shouldExit()) return code;  // --help, --list-test-cases, ...
  if (cases_run == 0) {
    std::fprintf(stderr,
                 "no test case ran: the filters on the command line match none (a test case's name with ';' "
                 "is cut in two by ctest's discovery; use ',' instead)\n");
    return code == 0 ? 1 : code;
  }
  return code;
}
