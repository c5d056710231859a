#include "model/train/plot.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace krause {

at::Tensor PlotPanel(const std::vector<Series>& series, int64_t width, int64_t height) {
  at::Tensor img = at::full({height, width, 3}, 255, at::kByte);
  auto px = img.accessor<uint8_t, 3>();
  auto put = [&](int64_t x, int64_t y, uint8_t r, uint8_t g, uint8_t b) {
    if (x < 0 || y < 0 || x >= width || y >= height) return;
    px[y][x][0] = r;
    px[y][x][1] = g;
    px[y][x][2] = b;
  };
  const int64_t left = 40, right = width - 10, top = 10, bottom = height - 25;
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  for (const Series& s : series) {
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!std::isfinite(s.y[i])) continue;
      x0 = std::min(x0, s.x[i]);
      x1 = std::max(x1, s.x[i]);
      y0 = std::min(y0, s.y[i]);
      y1 = std::max(y1, s.y[i]);
    }
  }
  if (!(x1 > x0)) x1 = x0 + 1;
  if (!(y1 > y0)) y1 = y0 + 1;
  const double pad = 0.05 * (y1 - y0);
  y0 -= pad;
  y1 += pad;
  // grid and axes
  for (int g = 0; g <= 4; ++g) {
    const int64_t y = top + (bottom - top) * g / 4, x = left + (right - left) * g / 4;
    for (int64_t i = left; i <= right; ++i) put(i, y, 225, 225, 225);
    for (int64_t j = top; j <= bottom; ++j) put(x, j, 225, 225, 225);
  }
  for (int64_t i = left; i <= right; ++i) put(i, bottom, 0, 0, 0);
  for (int64_t j = top; j <= bottom; ++j) put(left, j, 0, 0, 0);
  auto sx = [&](double x) { return left + std::lround((x - x0) / (x1 - x0) * (right - left)); };
  auto sy = [&](double y) { return bottom - std::lround((y - y0) / (y1 - y0) * (bottom - top)); };
  for (const Series& s : series) {
    if (s.x.size() <= 100) {  // few points: mark each one
      for (size_t i = 0; i < s.x.size(); ++i) {
        if (!std::isfinite(s.y[i])) continue;
        for (int dy = -2; dy <= 2; ++dy)
          for (int dx = -2; dx <= 2; ++dx) put(sx(s.x[i]) + dx, sy(s.y[i]) + dy, s.r, s.g, s.b);
      }
    }
    for (size_t i = 0; i + 1 < s.x.size(); ++i) {
      const size_t j = i + 1;
      if (!std::isfinite(s.y[i]) || !std::isfinite(s.y[j])) continue;
      const int64_t ax = sx(s.x[i]), ay = sy(s.y[i]), bx = sx(s.x[j]), by = sy(s.y[j]);
      const int64_t steps = std::max<int64_t>({1, std::abs(bx - ax), std::abs(by - ay)});
      for (int64_t t = 0; t <= steps; ++t) {
        const int64_t x = ax + (bx - ax) * t / steps, y = ay + (by - ay) * t / steps;
        put(x, y, s.r, s.g, s.b);
        put(x, y + 1, s.r, s.g, s.b);
      }
    }
  }
  return img;
}

}  // namespace krause
