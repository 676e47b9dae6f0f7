// ddp::data: the IDX reader, through zlib; a missing file is a ddp::error naming it.
#include <ddp/data/idx.hpp>

#include <string>

std::string uses_data() {
  try {
    (void)ddp::data::read_idx("/nonexistent/consumer.idx.gz", 1);
  } catch (const ddp::error& e) {
    return std::string(e.what()).find("consumer.idx.gz") != std::string::npos ? "ok: ddp::data names a missing file"
                                                                               : std::string("unexpected: ") + e.what();
  }
  return "ddp::data read a file that does not exist";
}
