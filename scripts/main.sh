#!/usr/bin/env bash
# The main job: set up, build module_moe_mxfp4_aux for every catalog shape, then run the
# aux pipeline of three real model shapes with every output checked against the reference
# (the third, without a fused shared expert, also runs the preamble from router logits, a8w4).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x "${AITER_AUX_VENV:-.venv}/bin/python" ] || echo "main.sh: first run: creating ${AITER_AUX_VENV:-.venv} (about a minute)"
bash scripts/setup.sh
. "${AITER_AUX_VENV:-.venv}/bin/activate"
aiter-aux build
aiter-aux run --shape 513,2560,640,11 --tokens 1,16,512,4096 --ep-ranks 2 --shared-init --routed-scaling 2.5
aiter-aux run --shape 385,7168,512,9 --tokens 1,16,512,4096
aiter-aux run --shape 256,7168,256,8 --tokens 1,64 --quant mxfp8
echo "main.sh: done: the catalog is built and every output of the three shapes matches the reference"
