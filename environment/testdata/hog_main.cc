// sandbox_hog: a misbehaving "evaluator" for the sandbox tests. Reads its
// mode from stdin: "spin" loops forever on the CPU, "alloc" touches 4 GiB,
// "sleep" blocks without using CPU, "fork" tries to start a process, "write"
// tries to create a file in /tmp, "net" tries to open a socket, "echo"
// prints its input back.
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

int main() {
  char buf[64] = {0};
  ssize_t n = ::read(0, buf, sizeof(buf) - 1);
  std::string mode(buf, n > 0 ? static_cast<size_t>(n) : 0);
  if (mode == "spin") {
    volatile unsigned long x = 0;
    while (true) ++x;
  }
  if (mode == "alloc") {
    const size_t size = size_t{4} << 30;
    // volatile: the allocation must happen. Nothing reads the bytes, so
    // clang otherwise drops the malloc and the memset as dead stores.
    char* volatile p = static_cast<char*>(std::malloc(size));
    if (p == nullptr) {
      std::printf("allocation refused\n");
      return 3;
    }
    std::memset(p, 1, size);
    std::printf("allocated\n");
    return 0;
  }
  if (mode == "sleep") {
    ::sleep(60);
    return 0;
  }
  if (mode == "fork") {
    pid_t pid = ::fork();
    if (pid == 0) _exit(0);
    if (pid > 0) ::waitpid(pid, nullptr, 0);
    std::printf(pid < 0 ? "fork refused\n" : "forked\n");
    return pid < 0 ? 4 : 0;
  }
  if (mode == "write") {
    FILE* f = std::fopen("/tmp/rlmesh_sandbox_hog_write", "w");
    bool wrote = f != nullptr && std::fputs("x", f) >= 0 && std::fflush(f) == 0;
    if (f != nullptr) std::fclose(f);
    std::remove("/tmp/rlmesh_sandbox_hog_write");
    std::printf(wrote ? "wrote\n" : "write refused\n");
    return wrote ? 0 : 5;
  }
  if (mode == "net") {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    std::printf(fd < 0 ? "socket refused\n" : "socket opened\n");
    return fd < 0 ? 6 : 0;
  }
  std::printf("%s\n", mode.c_str());
  return 0;
}
