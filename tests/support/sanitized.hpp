#pragma once
// DDP_TEST_SANITIZED: this unit is built under AddressSanitizer or ThreadSanitizer (GCC says so
// with __SANITIZE_*__, Clang through __has_feature), so the tests may shrink per-element sweeps
// whose instrumented loops cost minutes and reach no code path a smaller sweep does not.
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define DDP_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define DDP_TEST_SANITIZED 1
#endif
#endif
