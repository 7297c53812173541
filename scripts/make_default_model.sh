#!/usr/bin/env bash
# Export a student checkpoint and install its int8 bundle as models/default (what `distilembed serve`
# answers with right after install). Only the int8 model, the tokenizer and the manifest are kept
# (the fp32 graph would put the folder over 25 MB); the runtime encoder checks the hashes of just
# the files of the variant it loads.
#   bash scripts/make_default_model.sh runs/hpd-quick            # then commit models/default
set -euo pipefail
cd "$(dirname "$0")/.."
CKPT=${1:?usage: make_default_model.sh CHECKPOINT_DIR [BUNDLE_DIR]}
BUNDLE=${2:-runs/bundles/$(basename "$CKPT")}
DE=(.venv/bin/distilembed)

[ -f "$BUNDLE/manifest.json" ] || "${DE[@]}" export --model "$CKPT" --out "$BUNDLE"
mkdir -p models && tmp=$(mktemp -d models/.default.XXXXXX)
cp "$BUNDLE"/{manifest.json,model.int8.onnx,tokenizer.json} "$tmp/"
.venv/bin/python - "$CKPT" "$BUNDLE" "$tmp" <<'EOF'
import json, sys
from pathlib import Path

ckpt, bundle, out = (Path(p) for p in sys.argv[1:])
read = lambda folder: json.loads((Path(folder) / "manifest.json").read_text())
train, made = read(ckpt), read(bundle)
rotation = train.get("rotate")  # distilembed rotate: the checkpoint below, its output rotated
made_from = Path(rotation["source"]["path"]) if rotation else ckpt
train = read(made_from) if rotation else train
soup = "average" in train  # distilembed average: a model soup (of fine-tuned checkpoints, here)
ingredients = {Path(p): read(p) for p in train["average"]["chosen"]} if soup else {made_from: train}
first = next(iter(ingredients.values()))
provenance = {
    "checkpoint": str(ckpt),
    "bundle": str(bundle),
    "train_config": first["config"],
    "teacher": first["teacher"]["name"],
    "scores_pytorch": train.get("scores") or {"STS-B": made["parity"]["stsb_test_pytorch"]},
    "bundle_parity": made.get("parity"),
    "train_seconds": first.get("seconds"),
    "made_by": ["distilembed train ... (the train_config above; the command is in docs/results.md)"],
}
if "whiten" in first:  # distilembed whiten: a partial whitening folded into the last Dense layer
    white = first["whiten"]
    provenance["whiten"] = {k: white[k] for k in ("power", "corpus", "sentences", "texts_sha256", "candidates")}
    provenance["whiten"]["source_checkpoint"] = white["source"]["path"]
    target = first["finetune"]["source"]["path"] if "finetune" in first else next(iter(ingredients))
    provenance["made_by"].append(f"distilembed whiten {white['source']['path']} --out {target}")
tunes = []
keep = ("data", "triplets", "loss", "tau", "lr", "batch_size", "steps", "best_step", "best_dev_spearman")
for path, manifest in ingredients.items():  # distilembed finetune: NLI fine-tuning of the checkpoint above
    if "finetune" not in manifest:
        continue
    tune = manifest["finetune"]
    picked = {k: tune[k] for k in keep if k in tune}
    tunes.append({"checkpoint": str(path), **picked, "source_checkpoint": tune["source"]["path"]})
    provenance["made_by"].append(
        f"distilembed finetune {tune['source']['path']} --out {path} (lr {tune['lr']}, loss {tune['loss']};"
        " the other flags: finetune_* in train_config)"
    )
if soup:
    mix = train["average"]
    provenance["average"] = {
        "recipe": mix["recipe"],
        "chosen": mix["chosen"],
        "dev_spearman": mix["dev_spearman"],
        "ingredients": tunes,  # the fine-tuned ones among the chosen
    }
    sources = " ".join(s["path"] for s in mix["sources"])
    greedy = " --greedy" if mix["recipe"] == "greedy soup" else ""
    provenance["made_by"].append(f"distilembed average {sources}{greedy} --out {made_from}")
elif tunes:
    provenance["finetune"] = {k: v for k, v in tunes[0].items() if k != "checkpoint"}
if rotation:
    provenance["rotate"] = {k: rotation[k] for k in ("source", "best_step", "dev_by_width")}
    provenance["made_by"].append(f"distilembed rotate {made_from} --out {ckpt}")
provenance["made_by"].append(
    f"bash scripts/make_default_model.sh {ckpt}  (runs distilembed export --model {ckpt} --out {bundle})"
)
(out / "provenance.json").write_text(json.dumps(provenance, indent=2) + "\n")
EOF
chmod 755 "$tmp" && chmod 644 "$tmp"/*
rm -rf models/default.old
[ -d models/default ] && mv models/default models/default.old
mv "$tmp" models/default
rm -rf models/default.old
du -sh models/default
