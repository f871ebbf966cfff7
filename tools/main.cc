// Entry point of the `castor` program: dispatches to subcommands.
#include "tools/cli.h"

int main(int argc, char** argv) { return castor::tools::Main(argc, argv); }
