#pragma once
// doctest after libtorch: Debian's libtorch brings glog, whose CHECK and CHECK_EQ... macros would
// replace doctest's (a failed glog CHECK aborts the test program). Include this instead of
// <doctest/doctest.h> in the ddp::torch tests, after the torch headers.
#include <torch/torch.h>

#undef CHECK
#undef CHECK_EQ
#undef CHECK_NE
#undef CHECK_LT
#undef CHECK_LE
#undef CHECK_GT
#undef CHECK_GE
#include <doctest/doctest.h>
