// The versioned model repository on disk (server/repository.h): layouts told apart, versions
// read and sorted, config.json's options and version policy (and each of its errors), problems
// recorded per model and per version without hiding the rest, the policy's choice of versions.
// Files only: no model is loaded.
#include "server/repository.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace krause::server {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class RepositoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ =
        fs::path(::testing::TempDir()) /
        ("repo_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  void Write(const std::string& rel, const std::string& text) {
    const fs::path p = root_ / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  void Version(const std::string& model, const std::string& v) {
    Write(model + "/" + v + "/model.safetensors", "weights " + v);
  }
  std::vector<RepositoryModel> Scan() {
    auto r = ScanRepository(root_.string());
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : std::vector<RepositoryModel>{};
  }
  fs::path root_;
};

TEST_F(RepositoryTest, LayoutsAreToldApart) {
  EXPECT_FALSE(IsVersionedRepository(root_.string()));  // empty
  Version("m", "1");
  EXPECT_TRUE(IsVersionedRepository(root_.string()));
  Write("flat.safetensors", "x");  // a flat model beside: the flat layout
  EXPECT_FALSE(IsVersionedRepository(root_.string()));
  EXPECT_FALSE(IsVersionedRepository((root_ / "nope").string()));
}

TEST_F(RepositoryTest, VersionsAreReadSortedWithTheirProblems) {
  for (const char* v : {"10", "2", "1"}) Version("karm", v);
  fs::create_directories(root_ / "karm" / "3");  // no model.safetensors
  for (const char* bad : {"v4", "05", "-1", "0"}) fs::create_directories(root_ / "karm" / bad);
  Write("karm/README", "not a folder: ignored silently");
  const auto models = Scan();
  ASSERT_EQ(models.size(), 1u);
  const RepositoryModel& m = models[0];
  EXPECT_EQ(m.name, "karm");
  EXPECT_TRUE(m.problem.empty()) << m.problem;
  std::vector<int64_t> versions;
  for (const auto& v : m.versions) versions.push_back(v.version);
  EXPECT_EQ(versions, (std::vector<int64_t>{1, 2, 3, 10}));
  EXPECT_THAT(m.versions[2].problem, HasSubstr("3/model.safetensors: missing"));
  EXPECT_TRUE(m.versions[3].problem.empty());
  EXPECT_FALSE(m.versions[3].fingerprint.empty());
  EXPECT_EQ(m.versions[3].checkpoint, (root_ / "karm" / "10" / "model.safetensors").string());
  ASSERT_EQ(m.ignored.size(), 4u);
  EXPECT_THAT(m.ignored[0], HasSubstr("not a version"));
  // The default policy: the newest loadable version.
  EXPECT_EQ(PolicyVersions(m), std::vector<int64_t>{10});
}

TEST_F(RepositoryTest, AChangedCheckpointChangesItsFingerprint) {
  Version("m", "1");
  const std::string before = Scan()[0].versions[0].fingerprint;
  Write("m/1/model.safetensors", "other, longer weights");
  EXPECT_NE(Scan()[0].versions[0].fingerprint, before);
}

TEST_F(RepositoryTest, ConfigSetsOptionsAndPolicy) {
  for (const char* v : {"1", "2", "3", "4"}) Version("vit", v);
  Write("vit/config.json",
        R"({"max_batch_size": 16, "max_images_per_request": 8, "version_policy": {"latest": 2}})");
  Version("gen", "1");
  Version("gen", "3");
  Write("gen/config.json", R"({"max_sequences": 8, "version_policy": {"specific": [3, 1, 7]}})");
  const auto models = Scan();
  ASSERT_EQ(models.size(), 2u);
  const RepositoryModel& gen = models[0];
  const RepositoryModel& vit = models[1];
  EXPECT_EQ(vit.options.max_batch_size, 16);
  EXPECT_EQ(vit.options.max_images_per_request, 8);
  EXPECT_EQ(PolicyVersions(vit), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(gen.options.max_sequences, 8);
  EXPECT_EQ(PolicyVersions(gen), (std::vector<int64_t>{1, 3}));  // 7 does not exist
  const ModelSpec spec = SpecFor(vit, vit.versions[3]);
  EXPECT_EQ(spec.name, "vit");
  EXPECT_EQ(spec.version, 4);
  EXPECT_EQ(spec.max_batch_size, 16);
  EXPECT_EQ(spec.checkpoint, vit.versions[3].checkpoint);
}

TEST_F(RepositoryTest, ABadConfigIsThatModelsProblemOnly) {
  Version("good", "1");
  Version("bad", "1");
  Write("bad/config.json", R"({"max_batch": 4})");
  const auto models = Scan();
  ASSERT_EQ(models.size(), 2u);
  EXPECT_THAT(models[0].problem, HasSubstr("bad/config.json: unknown key \"max_batch\""));
  EXPECT_TRUE(PolicyVersions(models[0]).empty());
  EXPECT_TRUE(models[1].problem.empty());
  EXPECT_EQ(PolicyVersions(models[1]), std::vector<int64_t>{1});
}

TEST(ModelConfig, EachErrorNamesTheKey) {
  const struct {
    const char* json;
    const char* says;
  } cases[] = {
      {"[", "c.json: not a JSON object"},
      {R"({"name": "x"})", "unknown key \"name\""},
      {R"({"max_batch_size": "4"})", "c.json.max_batch_size must be an integer"},
      {R"({"max_batch_size": 0})", "max_batch_size must be in [1, 4096]"},
      {R"({"version_policy": {"newest": 1}})", "version_policy must be {\"latest\": N}"},
      {R"({"version_policy": {"latest": 1, "specific": [1]}})", "version_policy must be"},
      {R"({"version_policy": {"latest": 0}})", "latest must be an integer in [1, 64]"},
      {R"({"version_policy": {"latest": 1.5}})", "latest must be an integer"},
      {R"({"version_policy": {"specific": []}})", "specific must be a list of 1 to 64"},
      {R"({"version_policy": {"specific": [0]}})", "positive integer versions"},
      {R"({"version_policy": {"specific": ["2"]}})", "positive integer versions"},
  };
  for (const auto& c : cases) {
    ModelSpec options;
    VersionPolicy policy;
    const absl::Status st = ParseModelConfig(c.json, "c.json", &options, &policy);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << c.json;
    EXPECT_THAT(std::string(st.message()), HasSubstr(c.says)) << c.json;
  }
}

TEST_F(RepositoryTest, AFolderThatIsNotAModelNameIsListedWithItsProblem) {
  Version("has space", "1");
  const auto models = Scan();
  ASSERT_EQ(models.size(), 1u);
  EXPECT_THAT(models[0].problem, HasSubstr("not a model name"));
  EXPECT_TRUE(PolicyVersions(models[0]).empty());
}

}  // namespace
}  // namespace krause::server
