#pragma once
// Fashion-MNIST (28x28 grey images of 10 kinds of clothing), as Debian's dataset-fashion-mnist
// installs it under /usr/share/datasets/fashion-mnist. A model of ddp::data::dataset, read into
// memory (load) or memory-mapped from uncompressed files (map). Copies share the storage.
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ddp/data/dataset.hpp"
#include "ddp/data/idx.hpp"
#include "ddp/data/mapped_idx.hpp"
#include "ddp/nn/matrix.hpp"
#include "ddp/core/compiled_runtime.hpp"

namespace ddp::data {

class fashion_mnist {
 public:
  static constexpr std::string_view default_directory = "/usr/share/datasets/fashion-mnist";
  static constexpr std::size_t pixels = 28 * 28;
  static constexpr std::size_t classes = 10;
  // Mean and standard deviation of the training images' pixels in [0, 1].
  static constexpr float mean = 0.2860f, stddev = 0.3530f;
  static constexpr std::array<std::string_view, 10> class_names = {
      "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"};

  enum class split { train, test };

  struct example {
    const std::uint8_t* image = nullptr;  // 784 bytes, row-major
    std::int32_t label = 0;
  };
  using example_type = example;

  // A batch: normalised images as rows, and their labels.
  struct batch {
    nn::matrix x;
    std::vector<std::int32_t> y;
  };

  // Reads the gzipped files of `directory` into memory (47 MB for the training split).
  static fashion_mnist load(split which, const std::string& directory = std::string(default_directory));
  // Maps the uncompressed files of `directory` (train-images-idx3-ubyte, ...: gunzip -c each .gz
  // one into it) instead: nothing is read until a batch touches it, and the pages are the kernel's page
  // cache, shared by every rank and process on the host. The same examples, bit for bit.
  static fashion_mnist map(split which, const std::string& directory);

  std::size_t size() const noexcept { return labels_.size(); }
  example get(std::size_t i) const { return {images_.data() + i * pixels, static_cast<std::int32_t>(labels_[i])}; }

  // Collates examples into a batch, normalising each pixel to (x/255 - mean) / stddev.
  static batch collate(std::span<const example> examples);

 private:
  // The images and labels are views of `storage` (in memory or mapped), which the data set keeps.
  fashion_mnist(const std::vector<std::uint32_t>& image_dims, std::span<const std::uint8_t> images,
                const std::vector<std::uint32_t>& label_dims, std::span<const std::uint8_t> labels,
                const std::string& files, std::shared_ptr<const void> storage);

  std::span<const std::uint8_t> images_;
  std::span<const std::uint8_t> labels_;
  std::shared_ptr<const void> storage_;
};

static_assert(dataset<fashion_mnist>);

#if DDP_RUNTIME_DEFINITIONS

DDP_RUNTIME_INLINE fashion_mnist fashion_mnist::load(split which, const std::string& directory) {
  const std::string prefix = directory + (which == split::train ? "/train" : "/t10k");
  auto images_file = read_idx(prefix + "-images-idx3-ubyte.gz", 3);  // the images first: errors in file order
  auto owned = std::make_shared<std::pair<idx_array, idx_array>>(std::move(images_file),
                                                                  read_idx(prefix + "-labels-idx1-ubyte.gz", 1));
  auto& [images, labels] = *owned;
  return fashion_mnist(images.dims, images.values, labels.dims, labels.values, prefix + "-*-idx?-ubyte.gz",
                       std::move(owned));
}

DDP_RUNTIME_INLINE fashion_mnist fashion_mnist::map(split which, const std::string& directory) {
  const std::string prefix = directory + (which == split::train ? "/train" : "/t10k");
  mapped_idx images_file(prefix + "-images-idx3-ubyte", 3);
  auto files = std::make_shared<std::pair<mapped_idx, mapped_idx>>(std::move(images_file),
                                                                    mapped_idx(prefix + "-labels-idx1-ubyte", 1));
  auto& [images, labels] = *files;
  return fashion_mnist(images.dims(), images.values(), labels.dims(), labels.values(), prefix + "-*-idx?-ubyte",
                       std::move(files));
}

DDP_RUNTIME_INLINE fashion_mnist::batch fashion_mnist::collate(std::span<const example> examples) {
  batch b{nn::matrix(examples.size(), pixels), std::vector<std::int32_t>(examples.size())};
  constexpr float scale = 1.0f / (255.0f * stddev), shift = mean / stddev;
  for (std::size_t r = 0; r < examples.size(); ++r) {
    float* row = b.x.row(r);
    for (std::size_t p = 0; p < pixels; ++p) row[p] = static_cast<float>(examples[r].image[p]) * scale - shift;
    b.y[r] = examples[r].label;
  }
  return b;
}

DDP_RUNTIME_INLINE fashion_mnist::fashion_mnist(const std::vector<std::uint32_t>& image_dims,
                                                std::span<const std::uint8_t> images,
                                                const std::vector<std::uint32_t>& label_dims,
                                                std::span<const std::uint8_t> labels, const std::string& files,
                                                std::shared_ptr<const void> storage)
    : images_(images), labels_(labels), storage_(std::move(storage)) {
  if (image_dims[1] != 28 || image_dims[2] != 28)
    throw error("data", "load", -1,
                "'" + files + "': expected 28x28 images, found " + std::to_string(image_dims[1]) + "x" +
                    std::to_string(image_dims[2]));
  if (image_dims[0] != label_dims[0])
    throw error("data", "load", -1,
                "'" + files + "': " + std::to_string(image_dims[0]) + " images but " +
                    std::to_string(label_dims[0]) + " labels");
  for (std::size_t i = 0; i < labels_.size(); ++i)
    if (labels_[i] >= classes)
      throw error("data", "load", -1,
                  "'" + files + "': label " + std::to_string(labels_[i]) + " at index " + std::to_string(i) +
                      " is not a class in [0, 10)");
}

#endif  // DDP_RUNTIME_DEFINITIONS

}  // namespace ddp::data
