#!/usr/bin/env bash
# Gradescope image set-up (runs once, as root, with this zip unpacked in /autograder/source).
# Works on Gradescope's Ubuntu 22.04 and 24.04 base images: everything goes into a virtual
# environment (/autograder/venv), so PEP 668 ("externally managed environment") does not apply.
set -euo pipefail
cd /autograder/source
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# util-linux: setpriv (the sandbox user); libseccomp2: the filter that closes network sockets
apt-get install -y -qq --no-install-recommends python3 python3-venv util-linux libseccomp2 >/dev/null
python3 -m venv /autograder/venv
/autograder/venv/bin/pip install --no-cache-dir --upgrade pip
# The CPU build of torch (no CUDA libraries to download), the version the course is tested with.
/autograder/venv/bin/pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu \
  "$(cat torch-requirement.txt)"
/autograder/venv/bin/pip install --no-cache-dir -r grading-requirements.txt
