// Minimal line plots rendered to an RGB image (for training curves written as PNG): no plotting
// library, just axes, light grid lines and polylines, autoscaled.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace krause {

struct Series {
  std::vector<double> x, y;
  uint8_t r, g, b;
};

// A [height, width, 3] uint8 panel with the series drawn over a shared autoscaled frame.
at::Tensor PlotPanel(const std::vector<Series>& series, int64_t width, int64_t height);

}  // namespace krause
