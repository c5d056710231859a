// krause-client: the command-line client of krause-server.
//
//   krause-client list
//   krause-client health [--service krause.v1.KrauseService]
//   krause-client classify FILE... [--index 0:100] [--top 3]
//   krause-client generate [--num 4] [--seed 1] [--label Sneaker [--guidance 2]] [--out DIR]
//   krause-client complete PROMPT.png --rows 14 [--num 4] [--label Sneaker] [--out DIR]
//   krause-client score FILE... [--index 0:100] [--label NAME | --labels_file IDX]
//   krause-client models index [--ready] | models load NAME | models unload NAME
//                                                         [--model_version V]
//
// FILE: a PNG, or an IDX image file (MNIST / Fashion-MNIST, gzip or raw) with --index A:B.
// classify and score split the images into calls the model accepts (at most its
// max_images_per_request, and --batch).
//
// This file: the flags and the dispatch; the subcommands are in client/commands_*.cc
// (client/commands.h), models in client/models.cc.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "client/commands.h"
#include "client/connection.h"
#include "client/models.h"
#include "model/util/files.h"
#include "model/util/help.h"

ABSL_FLAG(std::string, server, "localhost:50051",
          "server: host:port or any gRPC target (dns:///name:port, ipv4:a:p,b:p: calls are "
          "spread round-robin over its addresses)");
ABSL_FLAG(bool, retry, true,
          "retry UNAVAILABLE (a replica draining or full) up to 4 attempts with backoff: list, "
          "classify, score, and generate before its first message");
ABSL_FLAG(std::string, model, "", "model name (empty: the server's default of the right kind)");
ABSL_FLAG(std::string, model_version, "",
          "the model's version (empty: the newest served); models load/unload: the version to "
          "load or unload (empty: the version policy's / every version)");
ABSL_FLAG(bool, ready, false, "models index: only the versions that serve now");
ABSL_FLAG(bool, json, false, "print the result as JSON");
ABSL_FLAG(double, timeout, 0, "deadline per call in seconds (0: none)");
ABSL_FLAG(bool, tls, false, "connect with TLS (system roots unless --tls_ca)");
ABSL_FLAG(std::string, tls_ca, "", "PEM roots to verify the server with (implies --tls)");
ABSL_FLAG(std::string, tls_cert, "", "PEM client certificate for mutual TLS (implies --tls)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_server_name, "", "name to check the server certificate against");
ABSL_FLAG(std::string, token, "", "bearer token");
ABSL_FLAG(std::string, token_file, "", "file holding the bearer token");
ABSL_FLAG(int64_t, max_message_bytes, 64 << 20, "largest message sent or received");
ABSL_FLAG(std::string, service, "", "health: the service to ask about (empty: the whole server)");
ABSL_FLAG(std::string, index, "", "IDX files: the images A:B (A inclusive, B exclusive) or A");
ABSL_FLAG(int32_t, top, 3, "classify: top classes to show per image");
ABSL_FLAG(int32_t, batch, 64,
          "classify/score: images per request at most (also at most the model's "
          "max_images_per_request)");
ABSL_FLAG(std::string, label, "",
          "generate/complete/score: the class (a label of a conditional generator) to draw, or "
          "to score every image with");
ABSL_FLAG(int32_t, class_index, -1,
          "generate/complete/score: the class by index (-1: none; instead of --label)");
ABSL_FLAG(std::string, labels_file, "",
          "score: an IDX label file (e.g. t10k-labels-idx1-ubyte.gz) giving each image's class, "
          "sliced with --index like the images");
ABSL_FLAG(double, guidance, -1,
          "generate/complete: classifier-free guidance scale with --label/--class_index (-1: "
          "the model's default, ModelInfo.default_guidance; 1: off; above 1 the images follow "
          "the class more closely, at twice the compute)");
ABSL_FLAG(int32_t, num, 1, "generate/complete: images to sample");
ABSL_FLAG(int32_t, priority, 0,
          "classify/generate/complete: 0 .. 2, higher served sooner among your tenant's calls "
          "(2 needs the token file's max_priority=2)");
ABSL_FLAG(int64_t, seed, -1,
          "generate/complete: the call's seed (image i draws from its own stream of (seed, i); -1: "
          "random)");
ABSL_FLAG(double, temperature, -1,
          "generate/complete: temperature (0: greedy; -1: the model's default, else 1)");
ABSL_FLAG(double, top_p, -1,
          "generate/complete: nucleus mass in (0, 1] (-1: the model's default, else 1: off)");
ABSL_FLAG(int32_t, top_k, 0,
          "generate/complete: keep the k most likely values (0: the model's default, else off); "
          "inspect: keys listed per query of a softmax model (0: the model's k)");
ABSL_FLAG(int32_t, rows, 0, "complete: prompt rows to keep");
ABSL_FLAG(std::string, out, ".", "generate/complete/inspect: folder for the PNG files");
ABSL_FLAG(std::string, prefix, "sample", "generate/complete: file names PREFIX-I.png");
ABSL_FLAG(std::string, layer, "", "inspect: layers, e.g. 0,2 (empty: every layer)");
ABSL_FLAG(std::string, head, "", "inspect: heads drawn, e.g. 1 (empty: every head)");
ABSL_FLAG(std::string, query, "",
          "inspect: token indices, e.g. 0,12 (classifiers: 0 = CLS, 1.. = patches; generators: "
          "input positions); empty: the centre token");
ABSL_FLAG(bool, summary, false,
          "inspect: print the per-layer, per-head figures (sink share, mean distance, effective "
          "neighbours) instead of heatmaps");
ABSL_FLAG(bool, progress, true, "generate/complete: live progress bar on stderr");
ABSL_FLAG(bool, resume, true,
          "generate/complete: when the stream breaks (the replica died, drained, or an attempt "
          "passed --attempt_timeout), ask the unfinished images again as completions from the "
          "rows received, on the next address; the images are the same byte for byte");
ABSL_FLAG(int32_t, max_resumes, 8, "generate/complete: breaks survived per call");
ABSL_FLAG(double, attempt_timeout, 0,
          "generate/complete: deadline of one attempt in seconds, after which it is resumed "
          "elsewhere (0: none; --timeout bounds the whole call)");

namespace cli = krause::client::cli;
using krause::client::ConnectionOptions;
namespace v1 = krause::v1;

int main(int argc, char** argv) {
  krause::ShowOwnFlagsInHelp();
  absl::SetProgramUsageMessage(
      "the command-line client of krause-server.\n"
      "  krause-client list\n"
      "  krause-client health [--service krause.v1.KrauseService]\n"
      "  krause-client classify FILE... [--index A:B] [--top 3]     (PNG files or IDX files)\n"
      "  krause-client generate [--num 4] [--seed 1] [--label Sneaker] [--out DIR]\n"
      "  krause-client complete PROMPT.png --rows 14 [--num 4] [--label Sneaker] [--out DIR]\n"
      "  krause-client score FILE... [--index A:B] [--label NAME | --labels_file IDX]\n"
      "  krause-client inspect FILE [--index I] [--layer L] [--head H] [--query Q] [--out DIR]\n"
      "                [--summary] [--top_k K]   (what the attention keeps: PNG heatmaps)\n"
      "  krause-client models index [--ready]    (model control; an admin token with auth)\n"
      "  krause-client models load NAME [--model_version V]\n"
      "  krause-client models unload NAME [--model_version V]\n"
      "classify and score split the images into calls the model accepts; score prints the mean.\n"
      "--label / --class_index: the class of a conditional generator (list --json shows its\n"
      "labels).\n"
      "Common: --server host:port, --model NAME, --json, --timeout S, --tls/--tls_ca/--tls_cert/\n"
      "--tls_key, --token/--token_file. Exit code 0 on success, 1 on an error, 2 on bad usage.");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() < 2) {
    std::fprintf(stderr,
                 "krause-client: a command is required (list, health, classify, generate, "
                 "complete, score, inspect, models); see --help\n");
    return 2;
  }
  const std::string cmd = args[1];
  std::vector<std::string> rest(args.begin() + 2, args.end());
  ConnectionOptions o;
  o.server = absl::GetFlag(FLAGS_server);
  o.retry = absl::GetFlag(FLAGS_retry);
  o.tls = absl::GetFlag(FLAGS_tls);
  o.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  o.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  o.tls_key = absl::GetFlag(FLAGS_tls_key);
  o.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  o.token = absl::GetFlag(FLAGS_token);
  o.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  o.timeout_seconds = absl::GetFlag(FLAGS_timeout);
  if (!absl::GetFlag(FLAGS_token_file).empty()) {
    auto t = krause::ReadFileToString(absl::GetFlag(FLAGS_token_file));
    if (!t.ok()) return cli::Fail(t.status().ToString());
    o.token = std::string(absl::StripAsciiWhitespace(*t));
  }
  auto channel = krause::client::MakeChannel(o);
  if (!channel.ok()) return cli::Fail(channel.status().ToString());
  auto stub = v1::KrauseService::NewStub(*channel);
  const bool as_json = absl::GetFlag(FLAGS_json);
  if (cmd == "list" && rest.empty()) return cli::List(*stub, o, as_json);
  if (cmd == "health" && rest.empty()) return cli::Health(*channel, o, as_json);
  if (cmd == "classify" && !rest.empty()) return cli::Classify(*stub, o, as_json, rest);
  if (cmd == "score" && !rest.empty()) return cli::Score(*stub, o, as_json, rest);
  if (cmd == "inspect" && rest.size() == 1) return cli::Inspect(*stub, o, as_json, rest[0]);
  if (cmd == "generate" && rest.empty()) return cli::Generate(*stub, o, as_json, "");
  if (cmd == "complete" && rest.size() == 1) return cli::Generate(*stub, o, as_json, rest[0]);
  if (cmd == "models" && !rest.empty())
    return krause::client::Models(*stub, o, as_json, rest, absl::GetFlag(FLAGS_model_version),
                                  absl::GetFlag(FLAGS_ready));
  std::fprintf(stderr, "krause-client: bad usage of \"%s\"; see --help\n", cmd.c_str());
  return 2;
}
