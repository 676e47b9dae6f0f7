#include <doctest/doctest.h>

#include <cmath>
#include <numbers>

#include "ddp/optim/schedule.hpp"

namespace optim_schedule_test {

namespace s = ddp::optim::schedule;

TEST_CASE("schedules: constant, cosine (with a floor), step decay, warm-up, and a lambda, composed") {
  CHECK(s::constant{}(12345) == 1.0f);

  const s::cosine cos(100);
  CHECK(cos(0) == 1.0f);
  CHECK(cos(50) == doctest::Approx(0.5f));
  CHECK(cos(100) == doctest::Approx(0.0f).epsilon(1e-7));
  const s::cosine floored(100, 0.1f);
  CHECK(floored(0) == doctest::Approx(1.0f));
  CHECK(floored(100) == doctest::Approx(0.1f));

  const s::step_decay decay(10, 0.5f);
  CHECK(decay(9) == 1.0f);
  CHECK(decay(10) == 0.5f);
  CHECK(decay(25) == 0.25f);

  const s::linear_warmup warm(4, cos);
  CHECK(warm(0) == doctest::Approx(0.25f * cos(0)));
  CHECK(warm(3) == doctest::Approx(cos(3)));
  CHECK(warm(50) == cos(50));

  const s::linear_warmup custom(2, [](std::size_t step) { return step < 10 ? 1.0f : 0.1f; });
  CHECK(custom(0) == 0.5f);
  CHECK(custom(11) == 0.1f);

  CHECK_THROWS_WITH(s::cosine(0), doctest::Contains("total steps must be at least 1"));
  CHECK_THROWS_WITH(s::step_decay(0, 0.5f), doctest::Contains("`every` must be at least 1"));
}

TEST_CASE("cosine gives the bits of the example's former hand-written schedule") {
  const std::size_t total = 4690;
  const float lr = 0.1f;
  const s::cosine cos(total);
  for (std::size_t step : {0u, 1u, 777u, 2345u, 4689u}) {
    const float before = lr * 0.5f * (1.0f + std::cos(std::numbers::pi_v<float> * static_cast<float>(step) /
                                                      static_cast<float>(total)));
    CHECK(lr * cos(step) == before);
  }
}

}  // namespace optim_schedule_test
