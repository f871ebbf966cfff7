// Entry point of the `castor` program: dispatches to subcommands.
#include "backend/cpu/blas_core.h"
#include "tools/cli.h"

int main(int argc, char** argv) {
  castor::cpu::RestartWithBestBlasCore(argv);  // may re-exec with OPENBLAS_CORETYPE set
  return castor::tools::Main(argc, argv);
}
