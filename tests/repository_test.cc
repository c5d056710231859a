// The versioned model repository on disk (server/core/repository.h): layouts told apart, versions
// read and sorted, config.json's options and version policy (and each of its errors), problems
// recorded per model and per version without hiding the rest, the policy's choice of versions.
// Files only: no model is loaded.
#include "server/core/repository.h"

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

// ---- PlanRepository: exact plans from plain values.

RepositoryModel Model(const std::string& name, std::vector<int64_t> versions, int64_t latest = 1) {
  RepositoryModel m;
  m.name = name;
  m.policy.latest = latest;
  for (int64_t v : versions) {
    RepositoryVersion rv;
    rv.version = v;
    rv.checkpoint = name + "/" + std::to_string(v) + "/model.safetensors";
    rv.fingerprint = "f" + std::to_string(v);
    m.versions.push_back(rv);
  }
  return m;
}

std::vector<std::string> Loads(const RepositoryPlan& p) {
  std::vector<std::string> out;
  for (const VersionLoad& l : p.load)
    out.push_back(l.spec.name + "@" + std::to_string(l.spec.version));
  return out;
}
std::vector<std::string> Unloads(const RepositoryPlan& p) {
  std::vector<std::string> out;
  for (const VersionKey& k : p.unload) out.push_back(k.name + "@" + std::to_string(k.version));
  return out;
}
ServedVersion At(const std::string& name, int64_t v, const std::string& fingerprint) {
  ServedVersion s;
  s.key.name = name;
  s.key.version = v;
  s.fingerprint = fingerprint;
  return s;
}
ServedVersion Served(const RepositoryModel& m, int64_t v) {
  for (const RepositoryVersion& rv : m.versions)
    if (rv.version == v) return At(m.name, v, VersionFingerprint(m, rv));
  return At(m.name, v, "gone");
}
using Names = std::vector<std::string>;

TEST(PlanRepositoryTest, ANewVersionLoadsAndThenTheOldOneUnloads) {
  const RepositoryModel vit = Model("vit", {1, 2});
  const RepositoryPlan p = PlanRepository({vit}, {Served(vit, 1)}, {});
  EXPECT_EQ(Loads(p), Names{"vit@2"});
  EXPECT_EQ(Unloads(p), Names{"vit@1"});
  EXPECT_EQ(p.load[0].spec.checkpoint, "vit/2/model.safetensors");
  EXPECT_EQ(p.load[0].fingerprint, "f2|");
}

TEST(PlanRepositoryTest, NothingChangedPlansNothing) {
  const RepositoryModel vit = Model("vit", {1, 2}, /*latest=*/2);
  const RepositoryPlan p = PlanRepository({vit}, {Served(vit, 1), Served(vit, 2)}, {});
  EXPECT_TRUE(p.load.empty());
  EXPECT_TRUE(p.unload.empty());
}

TEST(PlanRepositoryTest, ChangedFilesReloadTheVersion) {
  RepositoryModel vit = Model("vit", {1});
  ServedVersion s = Served(vit, 1);
  vit.versions[0].fingerprint = "f1-new";
  EXPECT_EQ(Loads(PlanRepository({vit}, {s}, {})), Names{"vit@1"});
  // config.json's change reloads too.
  vit.versions[0].fingerprint = "f1";
  vit.config_fingerprint = "c2";
  EXPECT_EQ(Loads(PlanRepository({vit}, {s}, {})), Names{"vit@1"});
}

TEST(PlanRepositoryTest, AFailedVersionIsNotRetriedUntilItsFilesChange) {
  RepositoryModel vit = Model("vit", {2, 3});
  FailedVersion f;
  f.key = At("vit", 3, "").key;
  f.fingerprint = VersionFingerprint(vit, vit.versions[1]);
  f.reason = "corrupt";
  // The policy falls back to 2, which serves: nothing to do, and 2 is not unloaded.
  RepositoryPlan p = PlanRepository({vit}, {Served(vit, 2)}, {f});
  EXPECT_TRUE(p.load.empty());
  EXPECT_TRUE(p.unload.empty());
  vit.versions[1].fingerprint = "f3-fixed";
  p = PlanRepository({vit}, {Served(vit, 2)}, {f});
  EXPECT_EQ(Loads(p), Names{"vit@3"});
  EXPECT_EQ(Unloads(p), Names{"vit@2"});
}

TEST(PlanRepositoryTest, AModelWithoutALoadableVersionKeepsWhatItServes) {
  RepositoryModel vit = Model("vit", {2});
  vit.versions[0].problem = "missing";
  const ServedVersion s = At("vit", 1, "f1|");
  EXPECT_TRUE(PlanRepository({vit}, {s}, {}).unload.empty());
  RepositoryModel broken = Model("vit", {1});
  broken.problem = "config.json: bad";
  const RepositoryPlan p = PlanRepository({broken}, {Served(broken, 1)}, {});
  EXPECT_TRUE(p.load.empty());
  EXPECT_TRUE(p.unload.empty());
}

TEST(PlanRepositoryTest, APollUnloadsAModelWhoseFolderIsGoneALoadDoesNot) {
  const RepositoryModel vit = Model("vit", {1});
  const ServedVersion gone = At("karm", 4, "f4|");
  EXPECT_EQ(Unloads(PlanRepository({vit}, {Served(vit, 1), gone}, {})), Names{"karm@4"});
  EXPECT_TRUE(PlanRepository({vit}, {Served(vit, 1), gone}, {}, "vit").unload.empty());
}

TEST(PlanRepositoryTest, OnlyTheNamedModelAndTheAskedVersion) {
  const RepositoryModel vit = Model("vit", {1, 2, 3}), karm = Model("karm", {1});
  RepositoryPlan p = PlanRepository({karm, vit}, {}, {}, "vit");
  EXPECT_EQ(Loads(p), Names{"vit@3"});
  // A version asked for loads beside the served ones; nothing is unloaded.
  p = PlanRepository({karm, vit}, {Served(vit, 3)}, {}, "vit", 1);
  EXPECT_EQ(Loads(p), Names{"vit@1"});
  EXPECT_TRUE(p.unload.empty());
  // A poll plans every model; the specific policy names exact versions.
  RepositoryModel specific = Model("vit", {1, 2, 3});
  specific.policy.specific = {1, 3};
  p = PlanRepository({karm, specific}, {Served(specific, 2)}, {});
  EXPECT_EQ(Loads(p), (Names{"karm@1", "vit@1", "vit@3"}));
  EXPECT_EQ(Unloads(p), Names{"vit@2"});
}

TEST(PlanRepositoryTest, AFailedReloadOfTheServingVersionKeepsItsOldCopy) {
  // Version 2 serves; its file is rewritten and the reload fails: 2 keeps serving from the old
  // copy, nothing falls back to 1, and the failed files are not loaded again.
  RepositoryModel vit = Model("vit", {1, 2});
  const ServedVersion old = Served(vit, 2);
  vit.versions[1].fingerprint = "f2-truncated";
  EXPECT_EQ(Loads(PlanRepository({vit}, {old}, {})), Names{"vit@2"});
  FailedVersion f;
  f.key = At("vit", 2, "").key;
  f.fingerprint = VersionFingerprint(vit, vit.versions[1]);
  f.reason = "truncated";
  const RepositoryPlan p = PlanRepository({vit}, {old}, {f});
  EXPECT_TRUE(p.load.empty());
  EXPECT_TRUE(p.unload.empty());
}

}  // namespace
}  // namespace krause::server
