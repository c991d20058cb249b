#!/usr/bin/env bash
# The GPU check (CI has no GPU; run on a CUDA machine from the repository root). Parts, each under its own
# timeout, each saving what it measured under ${OUT:-gpu_out} as soon as it finishes (a timeout still leaves
# data):
#   tests  tests/test_cuda.py: CPU==CUDA masks and batches, speed settings loss-neutral on CUDA, bf16 vs fp32,
#          seed, resume, fine-tune, plan timing, a CUDA checkpoint loading on CPU (-> cuda_tests.jsonl)
#   learn  bench/gpu_learn.yaml: its two arms' learning curves, trained side by side on the one GPU
#          (`study curve`, evals every 250 steps), then SST-2 fine-tuning of both and of random init,
#          aggregate and report (-> learn.tgz)
#   speed  python -m bench.gpu (ours against transformers.Trainer, BERT-base and the gpu profile's model; -> gpu/gpu.json),
#          `study plan ablations/nsp.yaml --profile gpu` (-> log.txt), then bench.gpu again with ours
#          at impl.compile + pad_to max (-> gpu_compiled/gpu.json)
#   pooling  learn's two runs fine-tuned on SST-2 again with the head on the mean of the last layer
#          (bench/gpu_learn_mean.yaml; the cpu recipe's choice), beside learn's [CLS] scores (-> pooling.tgz).
#          Needs learn's checkpoints: run it on the machine that ran learn, before it is given back
#   all    tests, learn, pooling, speed
# Usage: bash bench/gpu_check.sh [tests|learn|pooling|speed|all ...]
# A lent machine runs one command for at most 10 minutes: DEADLINE (seconds, default 540) caps the script,
# each part's timeout shrinking to what is left (a part with under 10 s left is skipped and says so). Run
# `tests learn` in one call and `pooling speed` in a second on the same warm machine (docs/RESULTS.md "GPU").
# DRY=1 checks the script on a CPU machine (tests/test_bench.py runs `DRY=1 bash bench/gpu_check.sh tests speed`):
# no staging or nvidia-smi needed; `speed` runs `bench.gpu --dry` (tiny shapes) and `study plan --no-time`, and
# leaves out the compiled run; learn and pooling (3,000-step runs) refuse to run dry.
#
# Staging, on a machine that has ../shared/data (the GPU machine prepares nothing: sentence splitting is
# CPU-bound, minutes there): `bash bench/gpu_check.sh --stage` copies the text the check reads into
# .gpudata/ (git-ignored), prepares gpu_learn's data folder (tokenizer + tokenized splits) in
# .gpudata/results, and packs .gpucarry/data.tgz plus wheels of the packages a GPU image may lack in
# .gpucarry/whl/. Both folders are git-ignored; carry .gpucarry to the GPU machine.
set -u
if [ "${1:-}" = "--stage" ]; then
  src=${SHARED_DATA:-../shared/data}
  py=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}   # the project's venv
  mkdir -p .gpudata/gutenberg .gpudata/glue/SST-2 .gpudata/glue/MRPC .gpucarry/whl
  cp -r "$src/wikitext-2-raw" "$src/PROVENANCE.md" .gpudata/
  cp "$src"/gutenberg/*.txt .gpudata/gutenberg/
  for t in SST-2 MRPC; do cp "$src/glue/$t/train.tsv" "$src/glue/$t/dev.tsv" .gpudata/glue/$t/; done
  $py -m study --results .gpudata/results prepare bench/gpu_learn.yaml --quiet || exit 1
  tar czf .gpucarry/data.tgz --exclude=.gpudata/results/runs .gpudata
  # the project's pins that a GPU image may lack (torch stays the image's own CUDA build); accelerate (and
  # its psutil) for bench/gpu.py's transformers.Trainer baseline, the pyproject's `bench` extra
  $py -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .gpucarry/whl \
    transformers==5.24.0 tokenizers==0.23.3 pydantic==2.14.4 pydantic_core==2.50.5 annotated-types \
    typing-inspection==0.4.5 pysbd==0.3.4 accelerate==1.16.0 psutil==7.2.2 || exit 1
  du -sh .gpucarry
  exit 0
fi
OUT=${OUT:-gpu_out}
DRY=${DRY:-0}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1 STUDY_GPU_REPORT=$OUT/cuda_tests.jsonl
for p in ${*:-all}; do
  case $p in tests|learn|pooling|speed|all) ;; *) echo "unknown part '$p': tests, learn, pooling, speed or all" >&2; exit 2 ;; esac
  case $DRY$p in 1learn|1pooling|1all) echo "DRY=1 runs tests and speed only ('$p' trains for minutes)" >&2; exit 2 ;; esac
done
[ "$DRY" = 1 ] || [ -d .gpudata ] || { [ -f .gpucarry/data.tgz ] && tar xzf .gpucarry/data.tgz; } || { echo "no .gpudata: stage first"; exit 1; }
# the pinned packages, where the image's own differ (installed into /tmp/site, never into the system)
pinned() { python3 -c 'import sys, transformers, pydantic, pysbd, accelerate; sys.exit(transformers.__version__ != "5.24.0")' 2>/dev/null; }
if [ -d .gpucarry/whl ] && [ ! -d /tmp/site ] && ! pinned; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .gpucarry/whl/*.whl || exit 1
fi
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
log() { tee -a "$OUT/log.txt"; }
step() { echo "=== $(date -u +%T) $*" | log; }
R=.gpudata/results
DEADLINE=${DEADLINE:-540}
# run "$@" under a timeout of $1 seconds, cut to what is left of DEADLINE ($SECONDS: since the script began);
# SIGTERM first (a run checkpoints on it), SIGKILL 15 s later if a CUDA call does not return
tmo() {
  local t=$1 left=$(( DEADLINE - SECONDS - 20 )); shift
  [ "$left" -lt "$t" ] && t=$left
  if [ "$t" -lt 10 ]; then echo "skipped, DEADLINE ${DEADLINE}s reached: $*" | log; return 124; fi
  timeout -k 15 "$t" "$@"
}

step machine
{ [ "$DRY" = 1 ] || tmo 30 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  tmo 60 python3 -c "import torch, transformers, tokenizers, pydantic; print('python', __import__('sys').version.split()[0],
'torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__,
'tokenizers', tokenizers.__version__, 'pydantic', pydantic.__version__)"; } 2>&1 | log

tests() {
  step "tests/test_cuda.py"
  tmo "${T_TESTS:-150}" python3 -m pytest -q -rA -p no:cacheprovider tests/test_cuda.py 2>&1 | log
}

learn() {
  step "learn: two curves side by side"
  for arm in post_ln pre_ln; do
    tmo "${T_CURVE:-330}" python3 -m study --results $R curve bench/gpu_learn.yaml --run $arm --every 250 \
      --quiet > "$OUT/curve_$arm.log" 2>&1 &
  done
  wait
  tail -n 4 "$OUT"/curve_*.log | log
  pack() {
    tar czf "$OUT/learn.tgz" $R/curves .gpudata/reports $(ls -d $R/runs/*/meta.json $R/runs/*/config.json \
      $R/runs/*/history.jsonl $R/runs/*/events.jsonl $R/runs/*/metrics.json $R/finetune $R/studies 2>/dev/null) \
      2>/dev/null
  }
  pack
  step "learn: SST-2 fine-tuning, pre-trained and random init"
  tmo "${T_FT:-180}" python3 -m study --results $R --reports .gpudata/reports finetune bench/gpu_learn.yaml \
    --quiet 2>&1 | tail -n 20 | log
  pack   # the fine-tuning results, before the aggregate (a timeout there still leaves them)
  tmo 60 python3 -m study --results $R --reports .gpudata/reports aggregate bench/gpu_learn.yaml 2>&1 | tail -n 5 | log
  tmo 60 python3 -m study --results $R --reports .gpudata/reports report bench/gpu_learn.yaml 2>&1 | tail -n 5 | log
  pack
  python3 - <<'EOF' 2>&1 | log
import glob, json
for f in sorted(glob.glob(".gpudata/results/runs/*/metrics.json")):
    m = json.load(open(f))
    print(f.split("/")[-2], {k: m.get(k) for k in ("device", "precision", "steps", "tokens_per_s", "mfu", "time_s",
          "ref_mlm_loss", "ref_mlm_acc", "ref_mask_acc")})
EOF
}

pooling() {
  step "pooling: SST-2 fine-tuning of learn's runs and random init again, the head on the mean"
  tmo "${T_FT2:-120}" python3 -m study --results $R --reports .gpudata/reports finetune bench/gpu_learn_mean.yaml \
    --quiet 2>&1 | tail -n 20 | log
  tar czf "$OUT/pooling.tgz" $R/finetune 2>/dev/null   # the fine-tuning results, before the aggregate
  tmo 60 python3 -m study --results $R --reports .gpudata/reports aggregate bench/gpu_learn_mean.yaml 2>&1 | tail -n 5 | log
  tmo 60 python3 -m study --results $R --reports .gpudata/reports report bench/gpu_learn_mean.yaml 2>&1 | tail -n 5 | log
  tar czf "$OUT/pooling.tgz" $R/finetune $R/studies .gpudata/reports 2>/dev/null
}

speed() {
  local dry=() res=$R
  [ "$DRY" = 1 ] && dry=(--dry) && res=$OUT/results
  step "bench.gpu ${dry[*]}"
  tmo "${T_BENCH:-240}" python3 -m bench.gpu "${dry[@]}" --steps 100 --out "$OUT/gpu" --results "$res" 2>&1 \
    | grep -v Warning | log
  step "study plan ablations/nsp.yaml --profile gpu"
  tmo 60 python3 -m study --results "$OUT/plan_results" plan ablations/nsp.yaml --profile gpu \
    $([ "$DRY" = 1 ] && echo --no-time) 2>&1 | log
  rm -rf "$OUT/plan_results"
  [ "$DRY" = 1 ] && { echo "DRY: the compiled run left out" | log; return 0; }
  step "bench.gpu, ours with static shapes and torch.compile"
  tmo "${T_BENCH:-240}" python3 -m bench.gpu --steps 100 --out "$OUT/gpu_compiled" --results $R \
    --impl compile=true pad_to=max 2>&1 | grep -v Warning | log
}

for p in ${*:-all}; do
  case $p in tests) tests ;; learn) learn ;; pooling) pooling ;; speed) speed ;; all) tests; learn; pooling; speed ;; esac
done
step done
