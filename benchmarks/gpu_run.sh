#!/usr/bin/env bash
# The GPU runner: installs the wheels carried in .whl/ (the peers: liger-kernel; cut-cross-entropy for the flce
# bench's cce rows), then runs the chosen parts, each under its own time limit; one log (run.log) and the benches'
# result files (JSON, PNG, measurements.csv) under $OUT (default benchmarks/results).
# Usage: LIMIT_S=SECONDS bash benchmarks/gpu_run.sh PART...   (default parts: tests flce e2e)
#   tests          the GPU tests (pytest -m gpu, over GPU_TEST_WORKERS xdist processes where xdist is installed):
#                  tests/kernels, tests/alignment/test_gpu_alignment.py and test_trl_head.py (GRPOTrainer with our
#                  head), tests/integrations/test_checkpointing.py, test_trl_flag.py (TRL's use_liger_kernel
#                  route; carry the trl and datasets wheels) and test_hub_kernels.py (transformers' kernel
#                  mapping: carry the kernels wheel that the installed transformers accepts); summary JSON in
#                  $OUT/gpu_tests.json; then, one at a time, those marked exclusive (they time a call or read a
#                  memory peak; gpu_tests_exclusive.json)
#   fidelity       custom ops on CUDA: opcheck of every op x layout, compiled variants, MoE router logits (installed
#                  transformers), compile-check rules
#   parity         bf16 GPU parity suite (tests/convergence, without the with-logits runs), strategy as planned, over
#                  GPU_TEST_WORKERS processes like the test parts (no parity test times a call or reads a peak)
#   parity-logits  bf16 with-logits parity of every family with a head (FLCE off, cross_entropy on)
#   parity-tokens  the parity suite with every apply() forcing the token-chunked FLCE; parity-vocab: vocab-chunked
#                  (the pytest plugin tests/convergence/force_flce_strategy.py)
#   flce / flce-quick   python -m benchmarks flce: each head (Llama-3, GPT-OSS) at 2048-16384 tokens as a multiple of
#                  the three-GEMM floor, ours / cce / liger / torch_native / unpatched (~2-4 min on an H100) / BT 2048
#                  and 8192 only (~1 min); FLCE_ARGS="--inputs confident,random" adds dense-softmax inputs (+50%)
#   flce-strategies     python -m benchmarks flce --strategies (each strategy forced, against the cost model)
#   e2e / e2e-quick     python -m benchmarks e2e (full / 2 layers, 1 repeat)
#   e2e-compile    e2e: hf, hf_compile, ours, ours_compile, liger on the llama and qwen3 2-layer cuts
#   e2e-recipes    e2e: the compile recipes (torch.compile(model), regional, max-autotune-no-cudagraphs,
#                  reduce-overhead) for hf and ours, and ours eager, on the llama 2-layer cut at 4096 tokens, one
#                  repeat (RECIPES="m1,m2,..." to choose; ~8-10 min: nine processes, compiled ones 40-90 s each,
#                  the max-autotune pair last and longest, each cut at 240 s)
#   step-compile   step: ours, hf_compile, ours_compile and the regional recipe of both on Llama-3.2-1B 2 x 4096,
#                  one repeat, no hf_noise (~6 min)
#   step           python -m benchmarks step (real configs at realistic depth); choose rows and methods with
#                  STEP_ARGS (e.g. "--models llama3_2_1b,qwen3_1_7b --shapes 2x4096 --methods hf,liger,ours
#                  --tag dense4k") when the whole table does not fit LIMIT_S; join the JSONs with step --merge
#   ops            python -m benchmarks ops (every op at 4096, 16384 and 32768 tokens, forward and backward, walls
#                  and kernel times against the copy; OPS_ARGS)
#   moe            MoE experts, its four parts in turn (each also a part of its own name): moe-tests, the GPU tests
#                  of tests/kernels/test_moe.py; moe-probe, benchmarks.probes.moe_kernels (ours vs grouped_mm,
#                  numerics vs fp32); moe-tune, `liger-registry tune moe` twice in two processes (an empty tile
#                  cache, then the one the first filled: $OUT/autotune, its JSON comes back); moe-bench,
#                  python -m benchmarks moe (MOE_ARGS; default: the four shapes at 4096 and 16384 tokens against
#                  hf:eager, hf:grouped_mm and liger, with ours' first call timed on an empty tile cache, and
#                  ours:persistent, the rows kernel's persistent schedule, off by default until this A/B)
#   rl-head        its parts rl-head-tests, the bf16 GPU test of the RL head (tests/kernels/test_rl_head.py -m gpu),
#                  and rl-head-bench, python -m benchmarks rl_head (per-token log-probs + entropy at GRPO shapes against TRL's head, liger and full logits;
#                  RL_HEAD_ARGS); about 2 minutes on an H100 (tests ~30 s, bench ~60-90 s)
#   distributed    python -m benchmarks distributed on every visible GPU (FSDP2 and DDP; DIST_ARGS)
#   compile        python -m benchmarks compile (every family's tiny model, inductor vs eager, 8 worker processes)
#   probe-chunk    benchmarks.probes.token_chunk (one token chunk's GEMMs and row kernel, GPT-OSS and Llama)
#   probe-rows     benchmarks.probes.row_stats (the row kernels' statistics pass: lanes or blocks, block caps; ROWS_ARGS,
#                  e.g. "--cases ce_rows --rows 4096,16384 --configs blocks8192,blocks16384,blocks32768 --warps
#                  8,16,32 --grad-out --grad-reversed" for the CE op, with T_PROBE=240)
#   positions      benchmarks.probes.positions (a patched model called without positions: compiled SDPA unmasked)
#   probe-step     benchmarks.probes.e2e_step (one e2e step by phase and kernel kind, ours and liger)
#   profile-step   the same on a step bench row (STEP_MODEL, default llama3_2_1b; STEP_SHAPE, default 2x4096;
#                  STEP_METHOD, default ours, then STEP_PEER, default liger); PROBE_ARGS=--memory: also the tensors
#                  alive at the step's peak, by allocating line
# Time: LIMIT_S is the whole call's limit in seconds (unset: none); a part's own limit T_<PART> (defaults below) is
# cut to what is left of LIMIT_S, so the log is complete when the caller's limit comes.
# TF_WHEELS=DIR (carried, e.g. .whl_tf525 from `pip download transformers==X`): that transformers instead of the
# installed one. Extra arguments: FLCE_ARGS, E2E_ARGS, STEP_ARGS, OPS_ARGS, MOE_ARGS, DIST_ARGS, COMPILE_ARGS,
# PROBE_ARGS, RL_HEAD_ARGS.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-benchmarks/results}
export OUT
mkdir -p "$OUT"
LOG=$OUT/run.log
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "gpu_run: installing .whl/*.whl failed"; exit 1; }
else
  echo "gpu_run: no .whl/ (carry [\".whl\"]): the peer liger-kernel will be missing" | tee -a "$LOG"
fi
if [[ -n "${TF_WHEELS:-}" ]]; then  # another transformers (and what it needs) over the installed one
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site_tf \
    "$TF_WHEELS"/*.whl || { echo "gpu_run: installing $TF_WHEELS/*.whl failed"; exit 1; }
  export PYTHONPATH=/tmp/site_tf${PYTHONPATH:+:$PYTHONPATH}
fi
# the repository first (python -m benchmarks, the package), then the carried wheels
export PYTHONPATH=$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used,temperature.gpu --format=csv,noheader | tee -a "$LOG"
summary=""
left() { echo $(( ${LIMIT_S:-1000000000} - SECONDS )); }
part() {  # part NAME LIMIT TAIL_LINES COMMAND...
  local name=$1 limit=$2 lines=$3 start=$SECONDS rc
  shift 3
  if (( limit > $(left) - 5 )); then limit=$(( $(left) - 5 )); fi
  if (( limit < 20 )); then
    echo "=== $name: skipped, $(left) s left" | tee -a "$LOG"; summary="$summary $name=skipped"; return
  fi
  echo "=== $name: $*" | tee -a "$LOG"
  timeout "$limit" "$@" 2>&1 | tee -a "$LOG" | tail -n "$lines"
  rc=$?
  echo "=== $name: rc $rc in $((SECONDS - start)) s" | tee -a "$LOG"
  summary="$summary $name=rc$rc/$((SECONDS - start))s"
}
limit_of() {  # limit_of DEFAULT: the part's limit, cut to what is left (a bench given a budget must see it)
  local t=$1
  if (( t > $(left) - 5 )); then t=$(( $(left) - 5 )); fi
  echo "$t"
}
bench() {  # bench NAME LIMIT TAIL_LINES BENCH ARGS...: python -m benchmarks BENCH ARGS --out $OUT
  local name=$1 limit=$2 lines=$3
  shift 3
  part "$name" "$limit" "$lines" python3 -m benchmarks "$@" --out "$OUT"
}
probe() {  # probe NAME LIMIT TAIL_LINES MODULE ARGS...: python -m benchmarks.probes.MODULE ARGS
  local name=$1 limit=$2 lines=$3 module=$4
  shift 4
  part "$name" "$limit" "$lines" python3 -m "benchmarks.probes.$module" "$@"
}
PYTEST="python3 -m pytest -q -p no:cacheprovider"
GPU_TESTS="tests/kernels tests/alignment/test_gpu_alignment.py tests/alignment/test_trl_head.py
  tests/integrations/test_checkpointing.py tests/integrations/test_hub_kernels.py tests/integrations/test_trl_flag.py"
# the test parts spread over GPU_TEST_WORKERS pytest-xdist processes (default 8) where xdist is installed (carry its
# wheels in .whl/): they spend most of their time compiling kernels, which is host work
WORKERS=""
if python3 -c "import xdist" 2> /dev/null && [[ "${GPU_TEST_WORKERS:-8}" != 0 ]]; then
  WORKERS="-n ${GPU_TEST_WORKERS:-8}"
fi
join_reports() {  # join_reports FILE: the xdist workers' FILE-stem.gwN.json into FILE
  python3 - "$1" << 'PY'
import glob, json, os, sys
path = sys.argv[1]
parts = sorted(glob.glob(os.path.splitext(path)[0] + ".gw*.json"))
if parts:
    loaded = [json.load(open(p)) for p in parts]
    json.dump({"device": loaded[0]["device"], "rows": [r for d in loaded for r in d["rows"]]}, open(path, "w"), indent=1)
    for p in parts:
        os.remove(p)
PY
}
for p in ${*:-tests flce e2e}; do
  case $p in
    tests) GPU_TEST_REPORT=$OUT/gpu_tests.json part tests "${T_TESTS:-300}" 30 \
             $PYTEST $WORKERS -s -m "gpu and not exclusive" $GPU_TESTS
           join_reports "$OUT/gpu_tests.json"
           # the tests that time a call or read a memory peak, one at a time: other processes would move them
           GPU_TEST_REPORT=$OUT/gpu_tests_exclusive.json part tests-exclusive "${T_TESTS_EXCLUSIVE:-90}" 20 \
             $PYTEST -s -m "gpu and exclusive" $GPU_TESTS ;;
    fidelity) part fidelity "${T_FIDELITY:-180}" 12 $PYTEST $WORKERS tests/kernels/test_opcheck.py \
                tests/kernels/test_compile_variants.py tests/convergence/test_moe_router_logits.py \
                tests/integrations/test_compile_families.py -k "not test_inductor_compile_with_triton" ;;
    parity) part parity "${T_PARITY:-300}" 60 $PYTEST $WORKERS -m gpu tests/convergence -k "not with_logits" ;;
    parity-logits) part parity-logits "${T_PARITY:-300}" 90 $PYTEST $WORKERS -m gpu tests/convergence -k with_logits ;;
    parity-tokens|parity-vocab)
      FORCE_FLCE_STRATEGY=${p#parity-} PYTHONPATH=$PYTHONPATH:$PWD/tests/convergence part "$p" "${T_PARITY:-300}" 60 \
        $PYTEST $WORKERS -p force_flce_strategy -m gpu tests/convergence -k "not with_logits" ;;
    flce) bench flce "${T_FLCE:-420}" 100 flce $FLCE_ARGS ;;
    flce-quick) bench flce-quick "${T_FLCE:-150}" 60 flce --quick $FLCE_ARGS ;;
    flce-strategies) bench flce-strategies "${T_FLCE:-300}" 40 flce --strategies $FLCE_ARGS ;;
    e2e) t=$(limit_of "${T_E2E:-600}")
         bench e2e "$t" 40 e2e --budget-s $(( t - 60 )) $E2E_ARGS ;;
    e2e-quick) t=$(limit_of "${T_E2E:-300}")
               bench e2e-quick "$t" 30 e2e --quick --budget-s $(( t - 60 )) $E2E_ARGS ;;
    e2e-compile) t=$(limit_of "${T_E2E:-400}")
                 bench e2e-compile "$t" 30 e2e --budget-s $(( t - 60 )) --layers 2 --tokens 4096 --repeats 1 \
                   --methods hf,hf_compile,ours,ours_compile,liger $E2E_ARGS ;;
    e2e-recipes) t=$(limit_of "${T_E2E:-600}")
                 bench e2e-recipes "$t" 40 e2e --budget-s $(( t - 60 )) --models llama --layers 2 --tokens 4096 \
                   --repeats 1 --methods "${RECIPES:-ours,hf_compile,ours_compile,hf_compile_regional,\
ours_compile_regional,hf_compile_cudagraphs,ours_compile_cudagraphs,hf_compile_autotune,ours_compile_autotune}" \
                   $E2E_ARGS ;;
    step-compile) t=$(limit_of "${T_STEP:-540}")
                  bench step-compile "$t" 60 step --budget-s $(( t - 25 )) --models llama3_2_1b --shapes 2x4096 \
                    --repeats 1 --no-noise --tag compile \
                    --methods ours,hf_compile,ours_compile,hf_compile_regional,ours_compile_regional $STEP_ARGS ;;
    step) t=$(limit_of "${T_STEP:-600}")
          bench step "$t" 70 step --budget-s $(( t - 25 )) $STEP_ARGS ;;
    ops) bench ops "${T_OPS:-360}" 140 ops $OPS_ARGS ;;
    moe|moe-tests) # the GPU tests only: on the device the CPU ones would use up the part's time
         part moe-tests "${T_MOE:-240}" 12 $PYTEST -m gpu tests/kernels/test_moe.py ;;&
    moe|moe-probe) probe moe-probe "${T_MOE_PROBE:-150}" 40 moe_kernels --tokens 4096,16384 ;;&
    moe|moe-tune)
         tune="python3 -m liger_registry.cli tune moe --family ${MOE_TUNE_FAMILY:-qwen3_moe} --tokens 4096,16384"
         rm -rf "$OUT/autotune"  # the first process searches with an empty cache, the second reads it
         LIGER_REGISTRY_CACHE_DIR=$OUT/autotune part moe-tune "${T_MOE_TUNE:-180}" 40 bash -c \
           "for run in empty-cache filled-cache; do echo \"--- \$run\"; time $tune || exit 1; done" ;;&
    moe|moe-bench)
         bench moe-bench "${T_MOE_BENCH:-600}" 70 moe ${MOE_ARGS:---shapes qwen3_moe,gpt_oss,mixtral,dbrx \
           --tokens 4096,16384 --methods ours,ours:persistent,hf:grouped_mm,hf:eager,liger} ;;&
    moe|moe-tests|moe-probe|moe-tune|moe-bench) ;;
    rl-head|rl-head-tests) part rl-head-tests "${T_RL_HEAD_TESTS:-90}" 12 $PYTEST -m gpu tests/kernels/test_rl_head.py ;;&
    rl-head|rl-head-bench) bench rl-head "${T_RL_HEAD:-150}" 40 rl_head $RL_HEAD_ARGS ;;&
    rl-head|rl-head-tests|rl-head-bench) ;;
    distributed) bench distributed "${T_DIST:-300}" 30 distributed $DIST_ARGS ;;
    compile) t=$(limit_of "${T_COMPILE:-300}")
             bench compile "$t" 85 compile --workers 8 --budget-s $(( t - 50 )) $COMPILE_ARGS ;;
    probe-chunk) part probe-chunk "${T_PROBE:-120}" 12 bash -c "python3 -m benchmarks.probes.token_chunk \
                   --shape gpt_oss && python3 -m benchmarks.probes.token_chunk --shape llama --chunks 2048" ;;
    probe-rows) probe probe-rows "${T_PROBE:-120}" 12 row_stats $ROWS_ARGS ;;
    positions) probe positions "${T_POSITIONS:-90}" 10 positions ;;
    probe-step) part probe-step "${T_PROBE:-180}" 80 bash -c "python3 -m benchmarks.probes.e2e_step --method ours \
                  && python3 -m benchmarks.probes.e2e_step --method liger" ;;
    profile-step)
      args="--step-model ${STEP_MODEL:-llama3_2_1b} --shape ${STEP_SHAPE:-2x4096} $PROBE_ARGS"
      part profile-step "${T_PROBE:-240}" 80 bash -c "python3 -m benchmarks.probes.e2e_step \
        --method ${STEP_METHOD:-ours} $args && python3 -m benchmarks.probes.e2e_step --method ${STEP_PEER:-liger} $args" ;;
    *) echo "gpu_run: unknown part $p" | tee -a "$LOG" ;;
  esac
done
echo "gpu_run:$summary" | tee -a "$LOG"
