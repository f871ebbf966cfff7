// PLACEHOLDER until the CLI is written.
#include "tools/cli.h"

namespace castor::tools {
int Main(int, char**) { return kExitOk; }
}  // namespace castor::tools
