#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# One door to the providers: only exs/prov/ may reach a provider's ops table; everything
# else calls the exs__prov_* wrappers of exs/prov/prov.h. Prints each offending line.
set -u
cd "$(dirname "$0")/.."
bad=$(grep -rnE --include='*.c' --include='*.h' -e '->ops\b|\bops(->|\.)[a-z_]+' exs tools samples blast |
      grep -v '^exs/prov/')
if [ -n "$bad" ]; then
    echo "check-prov-door: provider ops reached outside exs/prov/ (use the prov.h wrappers):"
    echo "$bad"
    echo "check-prov-door: 0 passed, 1 failed"
    exit 1
fi
echo "check-prov-door: 1 passed, 0 failed"
