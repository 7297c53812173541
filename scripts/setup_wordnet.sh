#!/bin/sh
# Install WordNet 3.0 (Debian's wordnet-base) for synonym augmentation (training/augment.py).
# Idempotent: does nothing when /usr/share/wordnet already holds it, or where apt-get is not
# available (use nltk.download('wordnet') or DISTILEMBED_WORDNET_DIR there).
set -eu

if [ -f /usr/share/wordnet/data.noun ]; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "setup_wordnet: no apt-get; skipping (run nltk.download('wordnet') instead)" >&2
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        SUDO="sudo -n"
    else
        echo "setup_wordnet: not root and no passwordless sudo; skipping wordnet-base" >&2
        exit 0
    fi
fi
export DEBIAN_FRONTEND=noninteractive
# --no-install-recommends: the data only, not the wordnet browser and its Tk libraries.
$SUDO apt-get install -y -q --no-install-recommends wordnet-base >/dev/null 2>&1 || {
    $SUDO apt-get update -q
    $SUDO apt-get install -y -q --no-install-recommends wordnet-base
}
test -f /usr/share/wordnet/data.noun
