#include "common/atomic_file.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "catch2/catch.hpp"
#include "common/testing/test_util.h"

namespace rlmesh {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

void WriteOld(const std::string& path, const std::string& contents) {
  std::ofstream(path, std::ios::binary) << contents;
  REQUIRE(ReadAll(path) == contents);
}

std::vector<std::string> Names(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

bool Contains(absl::string_view haystack, absl::string_view needle) {
  return haystack.find(needle) != absl::string_view::npos;
}

TEST_CASE("WriteFileAtomically creates and then replaces a file, leaving no temp file") {
  testing::TempDir dir;
  const std::string path = dir.File("state.json");
  REQUIRE(WriteFileAtomically(path, "first\n").ok());
  CHECK(ReadAll(path) == "first\n");
  const std::string big(3 << 20, 'x');  // several write(2) calls' worth
  REQUIRE(WriteFileAtomically(path, big).ok());
  CHECK(ReadAll(path) == big);
  REQUIRE(WriteFileAtomically(path, "").ok());
  CHECK(ReadAll(path).empty());
  CHECK(Names(dir.path()) == std::vector<std::string>{"state.json"});
}

TEST_CASE("WriteFileAtomically sets the requested mode") {
  testing::TempDir dir;
  const std::string path = dir.File("manifest");
  AtomicFileOptions options;
  options.mode = 0600;
  REQUIRE(WriteFileAtomically(path, "m", options).ok());
  struct stat st;
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
}

TEST_CASE("a missing directory is NOT_FOUND naming the path") {
  testing::TempDir dir;
  const std::string path = dir.File("no_such_dir/port");
  absl::Status s = WriteFileAtomically(path, "1234\n");
  CHECK(s.code() == absl::StatusCode::kNotFound);
  CHECK(Contains(s.message(), path));
}

TEST_CASE("a failed write leaves the old file intact and no temp file") {
  testing::TempDir dir;
  const std::string path = dir.File("weights.bin");
  WriteOld(path, "old contents");
  // A file size limit makes write(2) fail with EFBIG part-way (root is bound
  // by it too, unlike by directory permissions).
  struct rlimit old_limit;
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &old_limit) == 0);
  struct rlimit small = old_limit;
  small.rlim_cur = 4096;
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  absl::Status s = WriteFileAtomically(path, std::string(1 << 20, 'n'));
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  ::signal(SIGXFSZ, old_handler);
  CHECK_FALSE(s.ok());
  CHECK(Contains(s.message(), path));
  CHECK(Contains(s.message(), "write"));
  CHECK(ReadAll(path) == "old contents");
  CHECK(Names(dir.path()) == std::vector<std::string>{"weights.bin"});
}

TEST_CASE("a failed rename leaves the target as it was and no temp file") {
  testing::TempDir dir;
  // rename(2) of a file onto a directory fails (EISDIR).
  const std::string path = dir.File("taken");
  REQUIRE(std::filesystem::create_directory(path));
  absl::Status s = WriteFileAtomically(path, "new");
  CHECK_FALSE(s.ok());
  CHECK(Contains(s.message(), "rename"));
  CHECK(Contains(s.message(), path));
  CHECK(std::filesystem::is_directory(path));
  CHECK(Names(dir.path()) == std::vector<std::string>{"taken"});
}

TEST_CASE("AtomicFileWriter shows nothing at the path until Commit") {
  testing::TempDir dir;
  const std::string path = dir.File("model.safetensors");
  WriteOld(path, "old");
  {
    AtomicFileWriter w(path);
    REQUIRE(w.Open().ok());
    REQUIRE(w.Append("new ").ok());
    const char more[] = {'d', 'a', 't', 'a'};
    REQUIRE(w.Append(more, sizeof(more)).ok());
    CHECK(ReadAll(path) == "old");
    REQUIRE(w.Commit().ok());
  }
  CHECK(ReadAll(path) == "new data");
  CHECK(Names(dir.path()) == std::vector<std::string>{"model.safetensors"});
}

TEST_CASE("an AtomicFileWriter dropped without Commit removes its temp file") {
  testing::TempDir dir;
  const std::string path = dir.File("model.safetensors");
  WriteOld(path, "old");
  {
    AtomicFileWriter w(path);
    REQUIRE(w.Open().ok());
    REQUIRE(w.Append("half written").ok());
    CHECK(Names(dir.path()).size() == 2);
  }
  CHECK(ReadAll(path) == "old");
  CHECK(Names(dir.path()) == std::vector<std::string>{"model.safetensors"});
}

TEST_CASE("Append before Open and a second Commit are errors, not crashes") {
  testing::TempDir dir;
  AtomicFileWriter w(dir.File("f"));
  CHECK(w.Append("x").code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE(w.Open().ok());
  REQUIRE(w.Commit().ok());
  CHECK(w.Commit().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(ReadAll(dir.File("f")).empty());
}

TEST_CASE("FsyncDirectory names a directory it cannot open") {
  testing::TempDir dir;
  CHECK(FsyncDirectory(dir.path()).ok());
  CHECK(FsyncDirectory("").ok());  // the current directory
  const std::string missing = dir.File("missing");
  absl::Status s = FsyncDirectory(missing);
  CHECK(s.code() == absl::StatusCode::kNotFound);
  CHECK(Contains(s.message(), missing));
}

}  // namespace
}  // namespace rlmesh
