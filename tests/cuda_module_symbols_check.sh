#!/usr/bin/env bash
# Checks that every castor symbol the CUDA backend module leaves undefined
# is exported by each executable that loads it (tests/CMakeLists.txt runs it
# on castor and cuda_backend_test). The module takes castor's own code from
# the executable (backend/cuda_module.h); a missing export would only show
# as a dlopen error on a machine with a GPU.
#
#   bash tests/cuda_module_symbols_check.sh MODULE EXECUTABLE...
set -euo pipefail

(($# >= 2)) || { echo "usage: $0 MODULE EXECUTABLE..." >&2; exit 2; }
module="$1"
shift
command -v nm >/dev/null || { echo "cuda_module_symbols_check: nm (binutils) is needed" >&2; exit 2; }

# Mangled names in namespace castor (functions, methods, vtables, typeinfo).
needed="$(nm -D --undefined-only "$module" | awk '{print $NF}' | grep -E '^_Z[A-Z]*N[A-Z]*6castor' \
  | sort -u)"
count="$(grep -c . <<<"$needed" || true)"
if ((count == 0)); then
  echo "cuda_module_symbols_check: $module leaves no castor symbol undefined;" \
    "it is expected to take castor's code from the executable" >&2
  exit 1
fi
status=0
for executable in "$@"; do
  missing="$(comm -23 <(echo "$needed") \
    <(nm -D --defined-only "$executable" | awk '{print $NF}' | sort -u))"
  if [[ -n "$missing" ]]; then
    echo "$(basename "$executable") does not export $(grep -c . <<<"$missing") castor symbol(s)" \
      "that $(basename "$module") needs:"
    c++filt <<<"$missing" | sed 's/^/  /'
    status=1
  else
    echo "$(basename "$executable") exports all $count castor symbols $(basename "$module") needs"
  fi
done
exit $status
