// Local launch of a data-parallel run (see launcher.h).
#include "training/distributed/launcher.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "training/distributed/communicator.h"

extern char** environ;

namespace castor::distributed {

absl::StatusOr<int> FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  const bool bound = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
                     getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  const int error = errno;
  close(fd);
  if (!bound) {
    return absl::InternalError(absl::StrCat("no free port on 127.0.0.1: ", std::strerror(error)));
  }
  return static_cast<int>(ntohs(address.sin_port));
}

absl::StatusOr<std::string> CurrentExecutable() {
  char path[4096];
  const ssize_t length = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (length <= 0) {
    return absl::InternalError(absl::StrCat("cannot read /proc/self/exe: ", std::strerror(errno)));
  }
  return std::string(path, static_cast<size_t>(length));
}

std::vector<std::string> WithoutNprocFlag(const std::vector<std::string>& arguments) {
  std::vector<std::string> kept;
  for (size_t k = 0; k < arguments.size(); ++k) {
    if (arguments[k] == "--nproc") {
      ++k;  // and its value
      continue;
    }
    if (arguments[k].rfind("--nproc=", 0) == 0) continue;
    kept.push_back(arguments[k]);
  }
  return kept;
}

namespace {

// The environment of rank `rank`: this one without the group variables,
// plus them.
std::vector<std::string> RankEnvironment(int rank, int nproc, int port) {
  std::vector<std::string> environment;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    bool group_variable = false;
    for (const char* name : {kRankEnv, kWorldSizeEnv, kMasterAddrEnv, kMasterPortEnv, "LOCAL_RANK",
                             "LOCAL_WORLD_SIZE"}) {
      if (entry.rfind(absl::StrCat(name, "="), 0) == 0) group_variable = true;
    }
    if (!group_variable) environment.push_back(entry);
  }
  environment.push_back(absl::StrCat(kRankEnv, "=", rank));
  environment.push_back(absl::StrCat("LOCAL_RANK=", rank));
  environment.push_back(absl::StrCat(kWorldSizeEnv, "=", nproc));
  environment.push_back(absl::StrCat("LOCAL_WORLD_SIZE=", nproc));
  environment.push_back(absl::StrCat(kMasterAddrEnv, "=127.0.0.1"));
  environment.push_back(absl::StrCat(kMasterPortEnv, "=", port));
  return environment;
}

std::vector<char*> Pointers(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (std::string& s : strings) pointers.push_back(s.data());
  pointers.push_back(nullptr);
  return pointers;
}

std::string DescribeExit(int status) {
  if (WIFSIGNALED(status)) {
    return absl::StrCat("was killed by signal ", WTERMSIG(status), " (",
                        strsignal(WTERMSIG(status)), ")");
  }
  return absl::StrCat("exited with code ", WEXITSTATUS(status));
}

}  // namespace

int LaunchLocalRanks(const std::string& executable, const std::vector<std::string>& arguments,
                     int nproc, std::chrono::milliseconds grace, std::ostream& err) {
  absl::StatusOr<int> port = FreeLoopbackPort();
  if (!port.ok()) {
    err << "castor train: --nproc " << nproc << ": " << port.status().message() << "\n";
    return 1;
  }
  std::vector<pid_t> pids(static_cast<size_t>(nproc), -1);
  std::vector<bool> running(static_cast<size_t>(nproc), false);
  err.flush();
  for (int rank = 0; rank < nproc; ++rank) {
    std::vector<std::string> argv = {executable, "train"};
    argv.insert(argv.end(), arguments.begin(), arguments.end());
    std::vector<std::string> environment = RankEnvironment(rank, nproc, *port);
    std::vector<char*> argv_pointers = Pointers(argv);
    std::vector<char*> environment_pointers = Pointers(environment);
    const pid_t pid = fork();
    if (pid == 0) {
      // A rank does not outlive its launcher (killed, say).
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      execve(executable.c_str(), argv_pointers.data(), environment_pointers.data());
      _exit(127);
    }
    if (pid < 0) {
      err << "castor train: --nproc " << nproc << ": cannot start rank " << rank << ": "
          << std::strerror(errno) << "\n";
      for (int r = 0; r < rank; ++r) kill(pids[static_cast<size_t>(r)], SIGKILL);
      for (int r = 0; r < rank; ++r) waitpid(pids[static_cast<size_t>(r)], nullptr, 0);
      return 1;
    }
    pids[static_cast<size_t>(rank)] = pid;
    running[static_cast<size_t>(rank)] = true;
  }
  int left = nproc;
  int exit_code = 0;
  std::optional<std::chrono::steady_clock::time_point> kill_at;
  while (left > 0) {
    int status = 0;
    const pid_t done = waitpid(-1, &status, kill_at.has_value() ? WNOHANG : 0);
    if (done < 0 && errno == EINTR) continue;
    if (done < 0) break;
    if (done == 0) {  // some rank failed; waiting for the others to stop
      if (std::chrono::steady_clock::now() >= *kill_at) {
        for (int rank = 0; rank < nproc; ++rank) {
          if (!running[static_cast<size_t>(rank)]) continue;
          err << "castor train: rank " << rank << " of " << nproc << " still running "
              << grace.count() / 1000 << " s after the first failure: killing it\n";
          kill(pids[static_cast<size_t>(rank)], SIGKILL);
        }
        kill_at = std::chrono::steady_clock::time_point::max();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    for (int rank = 0; rank < nproc; ++rank) {
      if (pids[static_cast<size_t>(rank)] != done || !running[static_cast<size_t>(rank)]) continue;
      running[static_cast<size_t>(rank)] = false;
      --left;
      const bool failed = !WIFEXITED(status) || WEXITSTATUS(status) != 0;
      if (!failed) break;
      err << "castor train: rank " << rank << " of " << nproc << " " << DescribeExit(status)
          << "\n";
      if (exit_code == 0) {
        exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
        kill_at = std::chrono::steady_clock::now() + grace;
      }
      break;
    }
  }
  return exit_code;
}

}  // namespace castor::distributed
