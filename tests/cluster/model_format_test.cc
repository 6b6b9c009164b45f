// Tests cluster/model_format.h: an export is trusted no further than its
// directory (issue 49), for eps-predict and a warm start alike.

#include "cluster/model_format.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/npy.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/raw_npy.h"
#include "tests/testing/temp_dir.h"

namespace eps {
namespace {

using ::testing::HasSubstr;
using ::eps::testing::WriteRawNpy;
using nlohmann::json;

constexpr uint64_t kDim = 4;

// Writes part `stem` (a path without .keys.npy / .rows.npy): ids
// first..first+n-1, row i all i.
void WritePart(const std::string& stem, uint64_t first, uint64_t n) {
  std::filesystem::create_directories(std::filesystem::path(stem).parent_path());
  StatusOr<std::unique_ptr<NpyWriter>> keys = NpyWriter::Create(stem + ".keys.npy", "<u8", {});
  StatusOr<std::unique_ptr<NpyWriter>> rows =
      NpyWriter::Create(stem + ".rows.npy", "<f4", {kDim});
  ASSERT_TRUE(keys.ok() && rows.ok()) << keys.status() << rows.status();
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t id = first + i;
    const std::vector<float> row(kDim, static_cast<float>(id));
    ASSERT_TRUE((*keys)->Append(&id, 1).ok());
    ASSERT_TRUE((*rows)->Append(row.data(), 1).ok());
  }
  ASSERT_TRUE((*keys)->Close().ok());
  ASSERT_TRUE((*rows)->Close().ok());
}

// The manifest of one embedding "emb" with `parts`.
void WriteManifest(const std::string& dir, const std::vector<std::string>& parts) {
  const json param = {{"name", "emb"}, {"kind", "embedding"}, {"dim", kDim}, {"parts", parts}};
  const json manifest = {
      {"format", "eps-model"}, {"version", 1}, {"params", json::array({param})}};
  std::ofstream(dir + "/manifest.json") << manifest.dump();
}

// An export in DIR/model of two parts of 10 rows each, and a copy of one
// part outside it (DIR/outside/part-0) for the hostile manifests to name.
class ModelFormat : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::create_directories(model());
    WritePart(model() + "/params/emb/part-0", 0, 10);
    WritePart(model() + "/params/emb/part-1", 10, 10);
    WritePart(outside(), 100, 10);
    WriteManifest(model(), {"params/emb/part-0", "params/emb/part-1"});
  }

  std::string model() const { return dir_.Join("model"); }
  std::string outside() const { return dir_.Join("outside/part-0"); }
  std::string part0() const { return model() + "/params/emb/part-0"; }

  // ReadModelParam over the manifest's "emb": its status, the rows read
  // in *rows.
  Status ReadEmb(uint64_t* rows = nullptr) {
    StatusOr<json> manifest = ReadModelManifest(model());
    if (!manifest.ok()) return manifest.status();
    const json* param = FindModelParam(*manifest, "emb");
    EXPECT_NE(param, nullptr);
    if (param == nullptr) return absl::InternalError("no emb");
    uint64_t read = 0;
    Status status = ReadModelParam(
        model(), *param, kDim,
        [&](const uint64_t* ids, const float* values, uint64_t n, uint64_t stride) -> Status {
          for (uint64_t i = 0; i < n; ++i) EXPECT_EQ(values[i * stride], static_cast<float>(ids[i]));
          read += n;
          return absl::OkStatus();
        });
    if (rows != nullptr) *rows = read;
    return status;
  }

  testing::TempDir dir_;
};

TEST_F(ModelFormat, ReadsAnExportWhosePartsLieInside) {
  uint64_t rows = 0;
  ASSERT_TRUE(ReadEmb(&rows).ok());
  EXPECT_EQ(rows, 20u);
  // A link that stays inside the export is followed.
  std::filesystem::rename(part0() + ".keys.npy", model() + "/keys-0.npy");
  std::filesystem::create_symlink("../../keys-0.npy", part0() + ".keys.npy");
  const Status linked = ReadEmb(&rows);
  ASSERT_TRUE(linked.ok()) << linked;
  EXPECT_EQ(rows, 20u);
}

TEST_F(ModelFormat, RefusesAManifestThatIsADirectoryOrAFifo) {
  std::filesystem::remove(model() + "/manifest.json");
  std::filesystem::create_directory(model() + "/manifest.json");
  Status status = ReadModelManifest(model()).status();
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr(model() + "/manifest.json is a directory"));

  std::filesystem::remove(model() + "/manifest.json");
  ASSERT_EQ(::mkfifo((model() + "/manifest.json").c_str(), 0600), 0);
  status = ReadModelManifest(model()).status();
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr(model() + "/manifest.json is a FIFO"));

  std::filesystem::remove(model() + "/manifest.json");
  EXPECT_TRUE(absl::IsNotFound(ReadModelManifest(model()).status()));
}

TEST_F(ModelFormat, RefusesAPartThatIsAFifoWithoutBlocking) {
  std::filesystem::remove(part0() + ".keys.npy");
  ASSERT_EQ(::mkfifo((part0() + ".keys.npy").c_str(), 0600), 0);
  const Status status = ReadEmb();
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr(part0() + ".keys.npy is a FIFO"));
}

TEST_F(ModelFormat, RefusesAPartThatIsADirectory) {
  std::filesystem::remove(part0() + ".rows.npy");
  std::filesystem::create_directory(part0() + ".rows.npy");
  const Status status = ReadEmb();
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr(part0() + ".rows.npy is a directory"));
}

TEST_F(ModelFormat, RefusesPartPathsThatLeaveTheExport) {
  // Each names files that exist, so only the path check stands in the way.
  const std::vector<std::string> hostile = {
      "../outside/part-0", "params/../../outside/part-0", outside(), "params//emb/part-1",
      "./params/emb/part-1"};
  for (const std::string& part : hostile) {
    WriteManifest(model(), {"params/emb/part-1", part});
    const Status status = ReadEmb();
    EXPECT_TRUE(absl::IsDataLoss(status)) << part << ": " << status;
    EXPECT_THAT(status.message(), HasSubstr(model() + "/manifest.json: part '" + part + "'"));
    EXPECT_THAT(std::string(status.message()), ::testing::Not(HasSubstr("\n")));
  }
  EXPECT_THAT(ModelPartStem(model(), outside()).status().message(), HasSubstr("absolute"));
  EXPECT_THAT(ModelPartStem(model(), "../outside/part-0").status().message(), HasSubstr("'..'"));
  EXPECT_THAT(ModelPartStem(model(), std::string("params/emb/part-0\0x", 19)).status().message(),
              HasSubstr("NUL"));
  StatusOr<std::string> stem = ModelPartStem(model(), "params/emb/part-0");
  ASSERT_TRUE(stem.ok()) << stem.status();
  EXPECT_EQ(*stem, part0());
}

TEST_F(ModelFormat, RefusesAPartLinkedOutsideTheExport) {
  std::filesystem::remove(part0() + ".keys.npy");
  std::filesystem::create_symlink(outside() + ".keys.npy", part0() + ".keys.npy");
  Status status = ReadEmb();
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr(part0() + ".keys.npy resolves to "));
  EXPECT_THAT(status.message(), HasSubstr("outside the export"));

  // A relative link climbing out, on the rows.
  std::filesystem::remove(part0() + ".keys.npy");
  WritePart(part0(), 0, 10);
  std::filesystem::remove(part0() + ".rows.npy");
  std::filesystem::create_symlink("../../../outside/part-0.rows.npy", part0() + ".rows.npy");
  status = ReadEmb();
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr(part0() + ".rows.npy resolves to "));

  // A directory of the export linked outside: its files are outside too.
  std::filesystem::remove_all(model() + "/params/emb");
  std::filesystem::create_directories(dir_.Join("elsewhere"));
  WritePart(dir_.Join("elsewhere/part-0"), 0, 10);
  WritePart(dir_.Join("elsewhere/part-1"), 10, 10);
  std::filesystem::create_symlink(dir_.Join("elsewhere"), model() + "/params/emb");
  status = ReadEmb();
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("outside the export"));
}

TEST_F(ModelFormat, AMissingPartIsNotFoundNamingIt) {
  std::filesystem::remove(part0() + ".rows.npy");
  const Status status = ReadEmb();
  EXPECT_TRUE(absl::IsNotFound(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr(part0() + ".rows.npy"));
}

// Issue 49: rows of (n, 4194304) floats once made a reader ask for 64 GiB.
TEST_F(ModelFormat, RefusesAPartWhoseHeaderClaimsMoreThanItsFileHolds) {
  const std::string header =
      "{'descr': '<f4', 'fortran_order': False, 'shape': (10, 4194304), }\n";
  WriteRawNpy(part0() + ".rows.npy", 1, static_cast<uint32_t>(header.size()), header, 160);
  const Status status = ReadEmb();
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr(part0() + ".rows.npy"));
  EXPECT_THAT(status.message(), HasSubstr("truncated"));
}


// ValidateModelExport(model()) refuses with kDataLoss (or `code`), in one
// line naming `named`.
void ExpectRefusedNaming(const std::string& dir, const std::string& named,
                         absl::StatusCode code = absl::StatusCode::kDataLoss) {
  const Status status = ValidateModelExport(dir);
  EXPECT_EQ(status.code(), code) << status;
  EXPECT_THAT(status.message(), HasSubstr(named));
  EXPECT_THAT(std::string(status.message()), ::testing::Not(HasSubstr("\n")));
}

TEST_F(ModelFormat, ValidateModelExportPassesAnIntactExport) {
  const Status status = ValidateModelExport(model());
  EXPECT_TRUE(status.ok()) << status;
}

// Its business is the files, not the values: NaN weights are the
// servers' and the evaluation's to find.
TEST_F(ModelFormat, ValidateModelExportLeavesTheWeightsAlone) {
  std::filesystem::remove(part0() + ".rows.npy");
  StatusOr<std::unique_ptr<NpyWriter>> rows =
      NpyWriter::Create(part0() + ".rows.npy", "<f4", {kDim});
  ASSERT_TRUE(rows.ok()) << rows.status();
  const std::vector<float> nan(kDim, std::numeric_limits<float>::quiet_NaN());
  for (int i = 0; i < 10; ++i) ASSERT_TRUE((*rows)->Append(nan.data(), 1).ok());
  ASSERT_TRUE((*rows)->Close().ok());
  const Status status = ValidateModelExport(model());
  EXPECT_TRUE(status.ok()) << status;
}

TEST_F(ModelFormat, ValidateModelExportRefusesALyingHeader) {
  // 200 bytes whose v2 header claims 0xFFFFFFF0: refused before any
  // allocation of that size.
  const std::string path = part0() + ".keys.npy";
  const std::string header = "{'descr': '<u8', 'fortran_order': False, 'shape': (10,), }\n";
  WriteRawNpy(path, 2, 0xFFFFFFF0u, header, 200 - 12 - header.size());
  ExpectRefusedNaming(model(), path + " is not an array eps can read: the header claims "
                                      "4294967280 bytes");
}

TEST_F(ModelFormat, ValidateModelExportRefusesHugeRowsWithoutReadingThem) {
  const std::string path = part0() + ".rows.npy";
  const std::string header =
      "{'descr': '<f4', 'fortran_order': False, 'shape': (10, 4194304), }\n";
  WriteRawNpy(path, 1, static_cast<uint32_t>(header.size()), header, 4096);
  ExpectRefusedNaming(model(), path + " is not an array eps can read: truncated");
}

TEST_F(ModelFormat, ValidateModelExportRefusesHeadersThatDisagree) {
  // Rows of fewer floats than the manifest's dim, and ids of another count.
  WritePart(part0(), 0, 10);
  std::filesystem::remove(part0() + ".rows.npy");
  StatusOr<std::unique_ptr<NpyWriter>> rows =
      NpyWriter::Create(part0() + ".rows.npy", "<f4", {kDim - 1});
  ASSERT_TRUE(rows.ok()) << rows.status();
  const std::vector<float> row(kDim - 1, 1.0f);
  for (int i = 0; i < 10; ++i) ASSERT_TRUE((*rows)->Append(row.data(), 1).ok());
  ASSERT_TRUE((*rows)->Close().ok());
  ExpectRefusedNaming(model(), part0() + ".{keys,rows}.npy do not hold");

  WritePart(part0(), 0, 10);
  WritePart(model() + "/params/emb/short", 0, 9);
  std::filesystem::rename(model() + "/params/emb/short.keys.npy", part0() + ".keys.npy");
  ExpectRefusedNaming(model(), part0() + ".{keys,rows}.npy do not hold");
}

TEST_F(ModelFormat, ValidateModelExportRefusesAManifestThatIsADirectory) {
  std::filesystem::remove(model() + "/manifest.json");
  std::filesystem::create_directory(model() + "/manifest.json");
  ExpectRefusedNaming(model(), model() + "/manifest.json is a directory");
}

TEST_F(ModelFormat, ValidateModelExportRefusesAFifoPartWithoutBlocking) {
  const std::string path = part0() + ".rows.npy";
  std::filesystem::remove(path);
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  ExpectRefusedNaming(model(), path + " is a FIFO");
}

TEST_F(ModelFormat, ValidateModelExportRefusesPartsOutsideTheExport) {
  WriteManifest(model(), {"params/emb/part-1", "../outside/part-0"});
  ExpectRefusedNaming(model(), model() + "/manifest.json: part '../outside/part-0' holds '..'");
  WriteManifest(model(), {"params/emb/part-1", outside()});
  ExpectRefusedNaming(model(),
                      model() + "/manifest.json: part '" + outside() + "' is an absolute path");
  WriteManifest(model(), {"params/emb/part-0", "params/emb/part-1"});
  std::filesystem::remove(part0() + ".keys.npy");
  std::filesystem::create_symlink(outside() + ".keys.npy", part0() + ".keys.npy");
  ExpectRefusedNaming(model(), part0() + ".keys.npy resolves to ");
}

TEST_F(ModelFormat, ValidateModelExportRefusesEntriesOfTheWrongShape) {
  const json manifest = {{"format", "eps-model"},
                         {"version", 1},
                         {"params", json::array({{{"name", 5}, {"kind", "embedding"}}})}};
  std::ofstream(model() + "/manifest.json", std::ios::trunc) << manifest.dump();
  ExpectRefusedNaming(model(), model() + "/manifest.json: parameter ?");
  std::filesystem::remove(model() + "/manifest.json");
  ExpectRefusedNaming(model(), model() + "/manifest.json", absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace eps
