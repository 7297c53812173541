#!/usr/bin/env bash
# Index-build crash safety, measured (docs/results.md): build N Wikipedia sentences straight through,
# build them again but kill -9 the job once half the shards are on disk, rerun the same command,
# and compare the two finished indexes (count, ids, texts).
# Usage: scripts/check_build_resume.sh [BUNDLE] [N] [WORKDIR]
set -euo pipefail
BUNDLE=${1:-runs/bundles/hpd-mpnet}
N=${2:-100000}
W=${3:-runs/build-resume}
DATA=${DISTILEMBED_DATA_DIR:-../shared/data}
DE=(.venv/bin/distilembed)
rm -rf "$W" && mkdir -p "$W"
{ zcat "$DATA/unlabeled/enwiki2015_1m_sentences.txt.gz" || true; } | head -n "$N" > "$W/corpus.txt"  # zcat dies of SIGPIPE
half=$(( (N + 8191) / 8192 / 2 ))

/usr/bin/time -f "straight build: %e s" "${DE[@]}" index build --bundle "$BUNDLE" \
  --corpus "$W/corpus.txt" --out "$W/straight" > "$W/straight.log" 2>&1
"${DE[@]}" index build --bundle "$BUNDLE" --corpus "$W/corpus.txt" --out "$W/resumed" > "$W/killed.log" 2>&1 &
pid=$!
until [ "$(find "$W/resumed.partial/shards" -name '[0-9]*.npy' 2>/dev/null | wc -l)" -ge "$half" ]; do
  kill -0 "$pid" 2>/dev/null || { echo "build ended before the kill"; exit 1; }
  sleep 1
done
kill -9 "$pid"; wait "$pid" 2>/dev/null || true
echo "killed with $(find "$W/resumed.partial/shards" -name '[0-9]*.npy' | wc -l) shards on disk; resumed/ exists: $([ -e "$W/resumed" ] && echo yes || echo no)"
/usr/bin/time -f "rerun: %e s" "${DE[@]}" index build --bundle "$BUNDLE" \
  --corpus "$W/corpus.txt" --out "$W/resumed" > "$W/rerun.log" 2>&1
grep -ho "reused [0-9]* .*\|skipping .*" "$W/rerun.log" | head -3 || true
.venv/bin/python - "$W" <<'PY'
import sqlite3, sys
import faiss
w = sys.argv[1]
def summary(name):
    index = faiss.read_index(f"{w}/{name}/vectors.faiss")
    db = sqlite3.connect(f"{w}/{name}/docs.sqlite")
    rows = sorted(db.execute("SELECT * FROM docs").fetchall())
    return index.ntotal, rows
(a_n, a_rows), (b_n, b_rows) = summary("straight"), summary("resumed")
print(f"straight: ntotal {a_n}, {len(a_rows)} documents; resumed: ntotal {b_n}, {len(b_rows)} documents")
print("identical ids and texts:", a_rows == b_rows, "| same count:", a_n == b_n)
sys.exit(0 if a_rows == b_rows and a_n == b_n else 1)
PY
