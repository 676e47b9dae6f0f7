#pragma once
// Fashion-MNIST (28x28 grey images of 10 kinds of clothing), as Debian's dataset-fashion-mnist
// installs it under /usr/share/datasets/fashion-mnist. A model of ddp::data::dataset.
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/data/dataset.hpp"
#include "ddp/data/idx.hpp"
#include "ddp/nn/matrix.hpp"

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

  static fashion_mnist load(split which, const std::string& directory = std::string(default_directory)) {
    const std::string prefix = directory + (which == split::train ? "/train" : "/t10k");
    auto images = read_idx(prefix + "-images-idx3-ubyte.gz", 3);
    auto labels = read_idx(prefix + "-labels-idx1-ubyte.gz", 1);
    return fashion_mnist(std::move(images), std::move(labels), prefix);
  }

  std::size_t size() const noexcept { return labels_.size(); }
  example get(std::size_t i) const { return {images_.data() + i * pixels, static_cast<std::int32_t>(labels_[i])}; }

  // Collates examples into a batch, normalising each pixel to (x/255 - mean) / stddev.
  static batch collate(std::span<const example> examples) {
    batch b{nn::matrix(examples.size(), pixels), std::vector<std::int32_t>(examples.size())};
    constexpr float scale = 1.0f / (255.0f * stddev), shift = mean / stddev;
    for (std::size_t r = 0; r < examples.size(); ++r) {
      float* row = b.x.row(r);
      for (std::size_t p = 0; p < pixels; ++p) row[p] = static_cast<float>(examples[r].image[p]) * scale - shift;
      b.y[r] = examples[r].label;
    }
    return b;
  }

 private:
  fashion_mnist(idx_array images, idx_array labels, const std::string& prefix) {
    if (images.dims[1] != 28 || images.dims[2] != 28)
      throw error("data", "load", -1,
                  "'" + prefix + "-images-idx3-ubyte.gz': expected 28x28 images, found " +
                      std::to_string(images.dims[1]) + "x" + std::to_string(images.dims[2]));
    if (images.dims[0] != labels.dims[0])
      throw error("data", "load", -1,
                  "'" + prefix + "-*': " + std::to_string(images.dims[0]) + " images but " +
                      std::to_string(labels.dims[0]) + " labels");
    for (std::size_t i = 0; i < labels.values.size(); ++i)
      if (labels.values[i] >= classes)
        throw error("data", "load", -1,
                    "'" + prefix + "-labels-idx1-ubyte.gz': label " + std::to_string(labels.values[i]) +
                        " at index " + std::to_string(i) + " is not a class in [0, 10)");
    images_ = std::move(images.values);
    labels_ = std::move(labels.values);
  }

  std::vector<std::uint8_t> images_;
  std::vector<std::uint8_t> labels_;
};

static_assert(dataset<fashion_mnist>);

}  // namespace ddp::data
