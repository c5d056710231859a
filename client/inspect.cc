#include "client/inspect.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "model/util/png_pixels.h"

namespace krause::client {
namespace {

// The request image's pixels (gray), for the heatmaps' background.
struct Gray {
  int64_t height = 0, width = 0;
  std::vector<float> value;  // [0, 1], row-major
};

absl::StatusOr<Gray> GrayOf(const v1::Image& image) {
  PixelBuffer px;
  if (image.has_raw()) {
    px.height = image.raw().height();
    px.width = image.raw().width();
    px.channels = static_cast<int>(image.raw().channels());
    px.pixels = image.raw().pixels();
  } else {
    auto decoded = DecodePngPixels(image.png());
    if (!decoded.ok()) return decoded.status();
    px = std::move(*decoded);
  }
  if (px.channels < 1 ||
      static_cast<int64_t>(px.pixels.size()) != px.height * px.width * px.channels) {
    return absl::InvalidArgumentError("the image's size does not match its shape");
  }
  Gray g{px.height, px.width, std::vector<float>(px.height * px.width)};
  for (int64_t i = 0; i < px.height * px.width; ++i) {
    float sum = 0;
    for (int c = 0; c < px.channels; ++c)
      sum += static_cast<uint8_t>(px.pixels[i * px.channels + c]);
    g.value[i] = sum / (255.0f * px.channels);
  }
  return g;
}

struct Rgb {
  float r = 0, g = 0, b = 0;
};

Rgb Mix(Rgb a, Rgb b, float t) {
  return {a.r + (b.r - a.r) * t, a.g + (b.g - a.g) * t, a.b + (b.b - a.b) * t};
}

// Black -> red -> yellow -> white.
Rgb Heat(float t) {
  auto clamp = [](float x) { return std::min(1.0f, std::max(0.0f, x)); };
  return {clamp(3 * t), clamp(3 * t - 1), clamp(3 * t - 2)};
}

class Canvas {
 public:
  Canvas(int64_t h, int64_t w) : h_(h), w_(w), rgb_(h * w * 3, static_cast<char>(128)) {}
  void Put(int64_t y, int64_t x, Rgb c) {
    const auto byte = [](float v) {
      return static_cast<char>(static_cast<uint8_t>(std::lround(std::clamp(v, 0.0f, 1.0f) * 255)));
    };
    char* p = &rgb_[(y * w_ + x) * 3];
    p[0] = byte(c.r), p[1] = byte(c.g), p[2] = byte(c.b);
  }
  absl::Status Write(const std::string& path) const {
    auto png = EncodePngPixels(rgb_, h_, w_, 3);
    if (!png.ok()) return png.status();
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(png->data(), static_cast<std::streamsize>(png->size()));
    return f ? absl::OkStatus() : absl::PermissionDeniedError(absl::StrCat("cannot write ", path));
  }

 private:
  int64_t h_, w_;
  std::string rgb_;
};

// One query's heatmaps: the image, then layers x heads.
class QueryFigure {
 public:
  QueryFigure(const v1::InspectResponse& r, const Gray& image, int64_t heads)
      : r_(r), image_(image), gh_(r.grid_height()), gw_(r.grid_width()) {
    scale_ = std::max<int64_t>(
        1, (192 + std::max(image.height, image.width) - 1) / std::max(image.height, image.width));
    tile_h_ = image.height * scale_;
    tile_w_ = image.width * scale_;
    columns_ = 1 + heads;
    // Each grid cell's smallest token index (a generator's causality: what a query can see).
    first_token_.assign(gh_ * gw_, r.tokens());
    for (int t = 0; t < r.token_rows_size(); ++t) {
      if (r.token_rows(t) < 0) continue;
      int64_t& f = first_token_[r.token_rows(t) * gw_ + r.token_columns(t)];
      f = std::min<int64_t>(f, t);
    }
  }
  int64_t width() const { return columns_ * (tile_w_ + kGap) + kGap; }
  int64_t height(int64_t rows) const { return rows * (tile_h_ + kGap) + kGap; }

  // The image, dimmed or not, in tile (row, column).
  void DrawImage(Canvas* c, int64_t row, int64_t col, bool dim) const {
    for (int64_t y = 0; y < tile_h_; ++y) {
      for (int64_t x = 0; x < tile_w_; ++x) {
        const float v = image_.value[(y / scale_) * image_.width + x / scale_];
        const float shown = dim ? 0.15f + 0.45f * v : v;
        c->Put(Y(row) + y, X(col) + x, {shown, shown, shown});
      }
    }
  }

  // The query's weights as heat over the dimmed image; returns the weight on keys without a
  // place on the grid (CLS / start token).
  double DrawHeat(Canvas* c, int64_t row, int64_t col, const v1::QueryAttention& q,
                  bool causal) const {
    std::vector<double> cell(gh_ * gw_, 0.0);
    double off_grid = 0, peak = 0;
    for (int j = 0; j < q.keys_size(); ++j) {
      const uint32_t key = q.keys(j);
      if (key >= static_cast<uint32_t>(r_.token_rows_size()) || r_.token_rows(key) < 0) {
        off_grid += q.weights(j);
        continue;
      }
      double& w = cell[r_.token_rows(key) * gw_ + r_.token_columns(key)];
      w += q.weights(j);
      peak = std::max(peak, w);
    }
    DrawImage(c, row, col, true);
    const int64_t ch = tile_h_ / gh_, cw = tile_w_ / gw_;  // a cell's size in the tile
    for (int64_t y = 0; y < tile_h_; ++y) {
      for (int64_t x = 0; x < tile_w_; ++x) {
        const int64_t gy = std::min(gh_ - 1, y / ch), gx = std::min(gw_ - 1, x / cw);
        const float v = image_.value[(y / scale_) * image_.width + x / scale_];
        Rgb out{0.15f + 0.45f * v, 0.15f + 0.45f * v, 0.15f + 0.45f * v};
        const double w = cell[gy * gw_ + gx];
        if (peak > 0 && w > 0) {
          const float t = static_cast<float>(w / peak);
          out = Mix(out, Heat(t), 0.35f + 0.65f * t);
        } else if (causal && first_token_[gy * gw_ + gx] > static_cast<int64_t>(q.query())) {
          out = Mix(out, Rgb{0.08f, 0.1f, 0.4f}, 0.6f);  // after the query: not visible to it
        }
        c->Put(Y(row) + y, X(col) + x, out);
      }
    }
    // The query's own cell, outlined.
    const uint32_t qt = q.query();
    if (qt < static_cast<uint32_t>(r_.token_rows_size()) && r_.token_rows(qt) >= 0) {
      const int64_t y0 = r_.token_rows(qt) * ch, x0 = r_.token_columns(qt) * cw;
      const Rgb cyan{0.0f, 0.9f, 1.0f};
      for (int64_t i = 0; i < cw; ++i) {
        c->Put(Y(row) + y0, X(col) + x0 + i, cyan);
        c->Put(Y(row) + y0 + ch - 1, X(col) + x0 + i, cyan);
      }
      for (int64_t i = 0; i < ch; ++i) {
        c->Put(Y(row) + y0 + i, X(col) + x0, cyan);
        c->Put(Y(row) + y0 + i, X(col) + x0 + cw - 1, cyan);
      }
    }
    return off_grid;
  }

 private:
  static constexpr int64_t kGap = 4;
  int64_t Y(int64_t row) const { return kGap + row * (tile_h_ + kGap); }
  int64_t X(int64_t col) const { return kGap + col * (tile_w_ + kGap); }

  const v1::InspectResponse& r_;
  const Gray& image_;
  int64_t gh_, gw_, scale_ = 1, tile_h_ = 0, tile_w_ = 0, columns_ = 1;
  std::vector<int64_t> first_token_;
};

int Fail(const std::string& what) {
  std::fprintf(stderr, "krause-client: %s\n", what.c_str());
  return 1;
}

void PrintSummary(const v1::InspectResponse& r) {
  std::printf("%s (version %s, %s attention on %s): %u tokens, over every query of the image\n",
              r.model().c_str(), r.model_version().c_str(),
              r.attention() == v1::ModelInfo::KRAUSE ? "Krause" : "softmax",
              r.implementation().c_str(), r.tokens());
  std::printf("%5s %5s %8s %11s %14s %21s %13s %18s\n", "layer", "head", "sigma", "sink_share",
              "mean_distance", "effective_neighbours", "busiest_key", "busiest_key_share");
  for (const v1::LayerAttention& l : r.layers()) {
    double sink = 0, dist = 0, eff = 0, busiest = 0;
    for (const v1::HeadAttention& h : l.heads()) {
      std::printf("%5u %5u %8.3f %11.3f %14.2f %21.2f %13u %18.3f\n", l.layer(), h.head(),
                  h.sigma(), h.sink_share(), h.mean_distance(), h.effective_neighbours(),
                  h.busiest_key(), h.busiest_key_share());
      sink += h.sink_share(), dist += h.mean_distance(), eff += h.effective_neighbours();
      busiest += h.busiest_key_share();
    }
    const double n = std::max(1, l.heads_size());
    std::printf("%5u %5s %8s %11.3f %14.2f %21.2f %13s %18.3f\n", l.layer(), "mean", "", sink / n,
                dist / n, eff / n, "", busiest / n);
  }
}

}  // namespace

absl::StatusOr<std::vector<int64_t>> ParseIndexList(const std::string& text, const char* flag) {
  std::vector<int64_t> out;
  if (text.empty()) return out;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(part, &v) || v < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, " ", text, ": need indices >= 0 separated by commas"));
    }
    out.push_back(v);
  }
  return out;
}

int Inspect(v1::KrauseService::Stub& stub, const ConnectionOptions& o, const v1::Image& image,
            const std::string& name, const InspectArgs& args) {
  auto call = [&](const std::vector<int64_t>& queries, int64_t top_k, v1::InspectResponse* r) {
    v1::InspectRequest req;
    req.set_model(args.model);
    req.set_version(args.version);
    *req.mutable_image() = image;
    for (int64_t l : args.layers) req.add_layers(static_cast<uint32_t>(l));
    for (int64_t q : queries) req.add_queries(static_cast<uint32_t>(q));
    req.set_top_k(static_cast<uint32_t>(top_k));
    if (!args.label.empty()) req.set_label(args.label);
    if (args.class_index >= 0) req.set_class_index(static_cast<uint32_t>(args.class_index));
    grpc::ClientContext ctx;
    PrepareContext(o, &ctx);
    return stub.Inspect(&ctx, req, r);
  };
  // The summary covers every query whatever is listed: list one (the first asked, or token 0).
  // Heatmaps without --query: one call with token 0 for the grid, then the centre token.
  std::vector<int64_t> queries = args.queries;
  if ((args.summary || !args.as_json) && queries.empty()) queries = {0};
  if (args.summary) queries.resize(1);
  v1::InspectResponse r;
  grpc::Status st = call(queries, args.top_k, &r);
  if (!st.ok()) return Fail(absl::StrCat("inspect failed: ", Explain(st, o)));
  if (args.as_json) {
    std::string json;
    google::protobuf::util::JsonPrintOptions jo;
    jo.add_whitespace = true;
    jo.preserve_proto_field_names = true;
    jo.always_print_primitive_fields = true;
    if (!google::protobuf::util::MessageToJsonString(r, &json, jo).ok())
      return Fail("cannot print the reply as JSON");
    std::cout << json;
    return 0;
  }
  if (args.summary) {
    PrintSummary(r);
    return 0;
  }
  // Heatmaps: the centre token unless queries were given; a softmax model's every key unless
  // --top_k says otherwise (its heat is spread over all of them).
  bool again = false;
  if (args.queries.empty()) {
    const int cy = static_cast<int>(r.grid_height() / 2), cx = static_cast<int>(r.grid_width() / 2);
    for (int t = 0; t < r.token_rows_size(); ++t) {
      if (r.token_rows(t) == cy && r.token_columns(t) == cx) {
        queries = {t};
        again = t != 0;
        break;
      }
    }
  }
  int64_t top_k = args.top_k;
  if (r.attention() == v1::ModelInfo::SOFTMAX && top_k == 0) {
    top_k = r.tokens();
    again = true;
  }
  if (again) {
    r.Clear();
    st = call(queries, top_k, &r);
    if (!st.ok()) return Fail(absl::StrCat("inspect failed: ", Explain(st, o)));
  }
  // Heatmaps.
  auto gray = GrayOf(image);
  if (!gray.ok()) return Fail(absl::StrCat(name, ": ", gray.status().message()));
  if (r.layers_size() == 0 || r.grid_height() == 0) return Fail("the reply has no layers");
  const int heads_in_reply = r.layers(0).heads_size();
  std::vector<int> heads;
  for (int64_t h : args.heads) {
    if (h >= heads_in_reply)
      return Fail(absl::StrCat("--head ", h, ": the model has ", heads_in_reply, " heads"));
    heads.push_back(static_cast<int>(h));
  }
  if (heads.empty())
    for (int h = 0; h < heads_in_reply; ++h) heads.push_back(h);
  std::vector<int> drawn;  // indices into r.queries()
  for (int i = 0; i < r.queries_size(); ++i) drawn.push_back(i);
  std::error_code ec;
  std::filesystem::create_directories(args.out, ec);
  const bool generator = r.kind() == v1::ModelInfo::GENERATOR;  // causal: a query sees the past
  for (int qi : drawn) {
    QueryFigure fig(r, *gray, static_cast<int64_t>(heads.size()));
    Canvas canvas(fig.height(r.layers_size()), fig.width());
    const uint32_t qt = r.queries(qi);
    std::string legend;
    for (int l = 0; l < r.layers_size(); ++l) {
      fig.DrawImage(&canvas, l, 0, false);
      for (size_t c = 0; c < heads.size(); ++c) {
        const v1::QueryAttention& q = r.layers(l).heads(heads[c]).queries(qi);
        const double off = fig.DrawHeat(&canvas, l, static_cast<int64_t>(c) + 1, q, generator);
        absl::StrAppend(&legend, "\n  layer ", r.layers(l).layer(), " head ", heads[c], ": ",
                        q.keys_size(), " keys listed");
        if (off > 0)
          absl::StrAppend(&legend, ", ", off, " on the ", generator ? "start" : "CLS", " token");
        if (q.outside() > 0) absl::StrAppend(&legend, ", ", q.outside(), " on keys not listed");
      }
    }
    const std::string path = absl::StrCat(args.out, "/inspect-q", qt, ".png");
    if (absl::Status w = canvas.Write(path); !w.ok()) return Fail(w.ToString());
    std::printf("%s: query %u", path.c_str(), qt);
    if (r.token_rows(qt) >= 0)
      std::printf(" (row %d, column %d)", r.token_rows(qt), r.token_columns(qt));
    std::printf("; rows: layers; columns: the image, then heads%s", legend.c_str());
    std::printf("\n");
  }
  if (drawn.empty()) return Fail("no query to draw");
  return 0;
}

}  // namespace krause::client
