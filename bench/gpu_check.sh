#!/usr/bin/env bash
# The GPU check, one short script (CI has no GPU; run it on a CUDA machine from the repository root).
#   1. tests/test_cuda.py: speed settings loss-neutral on CUDA, bf16 vs fp32, seed, resume, fine-tune,
#      plan timing, a CUDA checkpoint loading on CPU (measurements -> $OUT/cuda_tests.jsonl)
#   2. bench/gpu_smoke.yaml end to end on the GPU: the gpu profile's model and batch for 300 steps on
#      local text, SST-2/MRPC fine-tuning, aggregate, report; tokens/s and MFU in its metrics
#   3. `study plan --profile gpu` of every shipped study: pre-training time of the gpu profiles on this GPU
# Data: .gpudata/ holds a copy of part of ../shared/data (gutenberg/, wikitext-2-raw/, glue/SST-2, glue/MRPC),
# made with `bash bench/gpu_check.sh --stage` on a machine that has ../shared/data.
# Packages: the project's (pip install -e .); a machine without them can bring wheels in .whl/ (installed
# into /tmp/site here, never into the system). Output: everything under ${OUT:-gpu_out}.
set -u
if [ "${1:-}" = "--stage" ]; then   # copy the check's data next to the repo (git-ignored: .gpudata/)
  src=${SHARED_DATA:-../shared/data}
  mkdir -p .gpudata/gutenberg .gpudata/glue/SST-2 .gpudata/glue/MRPC
  cp -r "$src/wikitext-2-raw" "$src/PROVENANCE.md" .gpudata/
  ls "$src/gutenberg" | head -14 | while read -r f; do cp "$src/gutenberg/$f" .gpudata/gutenberg/; done
  for t in SST-2 MRPC; do cp "$src/glue/$t/train.tsv" "$src/glue/$t/dev.tsv" .gpudata/glue/$t/; done
  exit 0
fi
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1 STUDY_GPU_REPORT=$OUT/cuda_tests.jsonl
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
log() { tee -a "$OUT/log.txt"; }
step() { echo "=== $(date -u +%T) $*" | log; }

step machine
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch, transformers, tokenizers, pydantic; print('python', __import__('sys').version.split()[0],
'torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__,
'tokenizers', tokenizers.__version__, 'pydantic', pydantic.__version__)"; } 2>&1 | log

step "tests/test_cuda.py"
timeout 180 python3 -m pytest -q -rA -p no:cacheprovider tests/test_cuda.py 2>&1 | log

step "study run bench/gpu_smoke.yaml"
t0=$(date +%s)
timeout 300 python3 -m study --results .gpudata/results --reports .gpudata/reports run bench/gpu_smoke.yaml \
  --quiet 2>&1 | log
echo "study run: exit ${PIPESTATUS[0]}, $(( $(date +%s) - t0 )) s wall" | log
python3 - <<'EOF' 2>&1 | log
import glob, json
for f in sorted(glob.glob(".gpudata/results/metrics/*.json")):
    m = json.load(open(f))
    print(f.split("/")[-1], {k: m.get(k) for k in ("device", "precision", "steps", "tokens_per_s", "mfu",
          "peak_flops", "time_s", "wall_s", "ref_mlm_loss", "ref_mlm_acc", "final_loss")})
EOF
tar czf "$OUT/gpu_smoke.tgz" .gpudata/results/metrics .gpudata/results/studies .gpudata/reports \
  $(ls -d .gpudata/results/runs/*/meta.json .gpudata/results/runs/*/history.jsonl .gpudata/results/runs/*/events.jsonl \
     .gpudata/results/finetune 2>/dev/null) 2>&1 | log

step "study plan --profile gpu"
for s in nsp mask_rate replacement depth; do
  timeout 45 python3 -m study --results "$OUT/plan_results" plan "ablations/$s.yaml" --profile gpu 2>&1 | log
done
step done
