// The csv, text and images data sources on arbitrary files: the input's first byte picks the
// reader (192 and above: images, its layout from the byte; below, even: csv, odd: text) and its
// options; the rest is the file. Opened, sized and read.
#include "fsdpx/data_source.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t pick = data[0];
  const auto path = fsdpx::fuzz::write("data.txt", data + 1, size - 1);
  fsdpx::fuzz::expect_clear_errors([&] {
    std::shared_ptr<fsdpx::DataSource> source;
    if (pick >= 192) {
      const char* layout[] = {"auto", "nchw", "nhwc"};
      source = fsdpx::fuzz::plugins().create<fsdpx::DataSource>(
          "images", std::map<std::string, std::string>{{"path", path.string()},
                                                       {"layout", layout[pick % 3]},
                                                       {"holdout", pick % 2 ? "0" : "0.5"}});
    } else if (pick % 2 == 0) {
      const char* header[] = {"auto", "yes", "no"};
      source = fsdpx::fuzz::plugins().create<fsdpx::DataSource>(
          "csv",
          std::map<std::string, std::string>{{"path", path.string()},
                                             {"header", header[(pick / 2) % 3]},
                                             {"label_column", std::to_string(static_cast<int>(pick / 6 % 5) - 2)}});
    } else {
      source = fsdpx::fuzz::plugins().create<fsdpx::DataSource>(
          "text",
          std::map<std::string, std::string>{{"path", path.string()}, {"seq", std::to_string(1 + pick / 2 % 16)}});
    }
    source->open(fsdpx::DataContext{0, 1, 1 + pick / 32 % 4, pick});
    for (int i = 0; i < 3; ++i) source->next();
  });
  return 0;
}
