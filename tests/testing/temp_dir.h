// TempDir: a fresh directory under the test temp dir, removed with its
// contents when the object goes away; SmallDisk, a tmpfs of a few MiB to
// fill up; and FreeLoopbackPort, for a server a test starts that cannot
// take port 0 itself.
//
// Thread-safety: a value owned by one test.

#ifndef EPS_TESTS_TESTING_TEMP_DIR_H_
#define EPS_TESTS_TESTING_TEMP_DIR_H_

#include <cstdint>
#include <string>

namespace eps::testing {

class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string Join(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A tmpfs of `megabytes` at `path` for the object's life (root only: the
// mount must outlive the processes a test starts, so no user namespace will
// do). error() says why there is none; a test then skips.
class SmallDisk {
 public:
  SmallDisk(const std::string& path, int megabytes);
  ~SmallDisk();
  SmallDisk(const SmallDisk&) = delete;
  SmallDisk& operator=(const SmallDisk&) = delete;
  const std::string& error() const { return error_; }

  // Fills what is left but `spare` bytes with a file; returns its path.
  std::string Fill(uint64_t spare);

 private:
  std::string path_;
  std::string error_;
  bool mounted_ = false;
};

// A TCP port free on 127.0.0.1 now (the kernel's pick, released at once);
// 0 when none could be had.
int FreeLoopbackPort();

}  // namespace eps::testing

#endif  // EPS_TESTS_TESTING_TEMP_DIR_H_
